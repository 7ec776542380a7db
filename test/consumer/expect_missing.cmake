# Asks an installed ashl for a component it does not have and checks that
# configuring fails with a message naming that component.
if(AVAILABLE STREQUAL "ucx")
  set(ask bogus)
else()
  set(ask ucx)
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${PREFIX} -DASHL_ASK_FOR=${ask}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "configure succeeded although component '${ask}' is unavailable")
endif()
if(NOT "${out}${err}" MATCHES "component '${ask}'")
  message(FATAL_ERROR "configure failed, but the message does not name component '${ask}':\n${out}${err}")
endif()
message(STATUS "find_package(ashl COMPONENTS ${ask}) failed as expected")
