# Install and export rules: headers, targets, ashlConfig.cmake with components.

set(ASHL_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/ashl" CACHE STRING "Where ashlConfig.cmake goes")

install(DIRECTORY include/ashl DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh")

set(_ashl_export_targets ashl)
foreach(_c ucx cuda nccl mpi torch)
  if(TARGET ashl_${_c})
    list(APPEND _ashl_export_targets ashl_${_c})
  endif()
endforeach()
install(TARGETS ${_ashl_export_targets} EXPORT ashlTargets)
install(EXPORT ashlTargets NAMESPACE ashl:: DESTINATION ${ASHL_INSTALL_CMAKEDIR})
export(EXPORT ashlTargets NAMESPACE ashl:: FILE "${CMAKE_CURRENT_BINARY_DIR}/ashlTargets.cmake")

get_property(ASHL_COMPONENTS_AVAILABLE GLOBAL PROPERTY ASHL_COMPONENTS_ON)
configure_package_config_file(cmake/ashlConfig.cmake.in "${CMAKE_CURRENT_BINARY_DIR}/ashlConfig.cmake"
  INSTALL_DESTINATION ${ASHL_INSTALL_CMAKEDIR})
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/ashlConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/ashlConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/ashlConfigVersion.cmake"
              cmake/FindNCCL.cmake
        DESTINATION ${ASHL_INSTALL_CMAKEDIR})
