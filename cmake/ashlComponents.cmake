# Finds the optional components and defines ashl::ucx, ashl::cuda, ashl::nccl,
# ashl::mpi and ashl::torch.
# Each one that is switched off or not found says so in one configure line.

function(ashl_detail_component_off name why)
  message(STATUS "ashl: component ${name} OFF (${why})")
  set_property(GLOBAL APPEND PROPERTY ASHL_COMPONENTS_OFF ${name})
endfunction()

function(ashl_detail_component_on name what)
  message(STATUS "ashl: component ${name} ON (${what})")
  set_property(GLOBAL APPEND PROPERTY ASHL_COMPONENTS_ON ${name})
endfunction()

macro(ashl_detail_require_or_off option name why)
  if(${option} STREQUAL "ON")
    message(FATAL_ERROR "ashl: ${option}=ON but ${name} is not available: ${why}")
  endif()
  ashl_detail_component_off(${name} "${why}")
endmacro()

# A component found: ashl::<name> (the INTERFACE target ashl_<name>, exported
# as <name>) links ashl and the given targets and defines
# ASHL_CONFIG_HAS_<NAME>=1; ASHL_HAVE_<NAME> is set ON and the configure line
# says "ON (<what>)".
function(ashl_detail_add_component name what)
  string(TOUPPER ${name} upper)
  add_library(ashl_${name} INTERFACE)
  add_library(ashl::${name} ALIAS ashl_${name})
  target_link_libraries(ashl_${name} INTERFACE ${ARGN})
  target_compile_definitions(ashl_${name} INTERFACE ASHL_CONFIG_HAS_${upper}=1)
  set_target_properties(ashl_${name} PROPERTIES EXPORT_NAME ${name})
  set(ASHL_HAVE_${upper} ON PARENT_SCOPE)
  ashl_detail_component_on(${name} "${what}")
endfunction()

# --- UCX ------------------------------------------------------------------
set(ASHL_HAVE_UCX OFF)
if(ASHL_WITH_UCX STREQUAL "OFF")
  ashl_detail_component_off(ucx "ASHL_WITH_UCX=OFF")
else()
  # The transport authenticates peers with HMAC-SHA256 (OpenSSL libcrypto),
  # so the component needs both.
  find_package(ucx CONFIG QUIET)
  find_package(OpenSSL QUIET COMPONENTS Crypto)
  if(ucx_FOUND AND TARGET ucx::ucp AND TARGET OpenSSL::Crypto)
    ashl_detail_add_component(ucx "UCX ${ucx_VERSION}, OpenSSL ${OPENSSL_VERSION}" ashl ucx::ucp OpenSSL::Crypto)
    if(TARGET ucx::ucs)  # ucs_status_string and the rest of UCX's service layer
      target_link_libraries(ashl_ucx INTERFACE ucx::ucs)
    endif()
  elseif(NOT (ucx_FOUND AND TARGET ucx::ucp))
    ashl_detail_require_or_off(ASHL_WITH_UCX ucx "UCX CMake config not found; apt-get install libucx-dev")
  else()
    ashl_detail_require_or_off(ASHL_WITH_UCX ucx "OpenSSL libcrypto not found (peer authentication); apt-get install libssl-dev")
  endif()
endif()

# --- CUDA -----------------------------------------------------------------
set(ASHL_HAVE_CUDA OFF)
if(ASHL_WITH_CUDA STREQUAL "OFF")
  ashl_detail_component_off(cuda "ASHL_WITH_CUDA=OFF")
else()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    ashl_detail_add_component(cuda "CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}"
                              ashl CUDA::cudart)
    # cxx_std_20 on ashl covers only the CXX language; .cu files need C++20
    # too, and CMake 3.25 has no cuda_std_20 feature for nvcc, so say it directly.
    target_compile_options(ashl_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
    if(TARGET CUDA::cccl)
      target_link_libraries(ashl_cuda INTERFACE CUDA::cccl)
    endif()
  else()
    ashl_detail_require_or_off(ASHL_WITH_CUDA cuda "no CUDA compiler or toolkit found")
  endif()
endif()

# --- NCCL -----------------------------------------------------------------
set(ASHL_HAVE_NCCL OFF)
if(ASHL_WITH_NCCL STREQUAL "OFF")
  ashl_detail_component_off(nccl "ASHL_WITH_NCCL=OFF")
elseif(NOT ASHL_HAVE_CUDA)
  ashl_detail_require_or_off(ASHL_WITH_NCCL nccl "needs the cuda component")
else()
  find_package(NCCL QUIET)
  if(NCCL_FOUND)
    ashl_detail_add_component(nccl "NCCL ${NCCL_VERSION} at ${NCCL_LIBRARY}" ashl_cuda NCCL::NCCL)
  else()
    ashl_detail_require_or_off(ASHL_WITH_NCCL nccl "nccl.h / libnccl not found (set NCCL_ROOT)")
  endif()
endif()

# --- MPI ------------------------------------------------------------------
# Host-memory collectives (include/ashl/coll/mpi.hpp) through MPI's C API;
# Debian's OpenMPI 4.1 (libopenmpi-dev openmpi-bin) runs over UCX itself.
set(ASHL_HAVE_MPI OFF)
if(ASHL_WITH_MPI STREQUAL "OFF")
  ashl_detail_component_off(mpi "ASHL_WITH_MPI=OFF")
else()
  # Only CXX is an enabled language; MPI::MPI_CXX carries the C API too.
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    ashl_detail_add_component(mpi "MPI ${MPI_CXX_VERSION}, mpiexec ${MPIEXEC_EXECUTABLE}" ashl MPI::MPI_CXX)
  else()
    ashl_detail_require_or_off(ASHL_WITH_MPI mpi "MPI not found; apt-get install libopenmpi-dev openmpi-bin")
  endif()
endif()

# --- libtorch ---------------------------------------------------------------
# The framework adapter (include/ashl/adapt/torch.hpp) and the Python module
# need libtorch: Debian libtorch-dev, or the C++ part of the PyPI torch wheel
# (-DTorch_DIR=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch).
set(ASHL_HAVE_TORCH OFF)
if(ASHL_WITH_TORCH STREQUAL "OFF")
  ashl_detail_component_off(torch "ASHL_WITH_TORCH=OFF")
else()
  find_package(Torch QUIET)
  if(Torch_FOUND AND TORCH_LIBRARIES)
    ashl_detail_add_component(torch "libtorch ${Torch_VERSION} at ${Torch_DIR}" ashl ${TORCH_LIBRARIES})
  else()
    ashl_detail_require_or_off(ASHL_WITH_TORCH torch "libtorch not found; apt-get install libtorch-dev, or set Torch_DIR")
  endif()
endif()
