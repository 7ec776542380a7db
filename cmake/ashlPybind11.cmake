# Finds the pybind11 that the Python module ashl._ashl is built with
# (python/CMakeLists.txt; docs/torch.md, "Which torch, numpy and pybind11").
#
#   set(Python_EXECUTABLE /path/to/venv/bin/python)   # the interpreter the module is for
#   ashl_find_pybind11(problem)
#   if(problem) message(FATAL_ERROR "${problem}") endif()
#
# Order: an explicit -Dpybind11_DIR; else the interpreter's own pybind11
# (`python -m pybind11 --cmakedir`, the one pip installed next to the numpy
# the module will meet); else any pybind11 CMake config on the search path
# (Debian's pybind11-dev in /usr/lib/cmake). The interpreter's comes before
# the system's because the pair must match: a pybind11 before 2.12 reads a
# numpy dtype descriptor with numpy 1's layout, and numpy 2 moved the item
# size in it, so every float32 array would read as another dtype.
#
# Sets <problem> to a sentence naming what is missing or mismatched and how
# to get it, or to "" when pybind11 was found and fits the interpreter's
# numpy. pybind11_DIR is cached as usual; ASHL_PYBIND11_SOURCE says where
# it came from (explicit, interpreter, system) for the summary line.

# The first pybind11 release that reads numpy 2's descriptors (pybind11 PR #5050).
set(ASHL_PYBIND11_NUMPY2_MIN 2.12)

# A macro, not a function: pybind11's config leaves variables that
# pybind11_add_module reads later, in the caller's scope.
macro(ashl_find_pybind11 problem_var)
  set(${problem_var} "")
  set(PYBIND11_FINDPYTHON ON)

  # An explicit -Dpybind11_DIR wins; one that an earlier configure cached
  # here does not, so a pybind11 installed into the interpreter later is
  # picked up on the next configure. A build directory configured before
  # this lookup existed has a pybind11_DIR that find_package found and no
  # record of it (a first configure has no CMakeCache.txt yet): found, not
  # given, so it is looked up again.
  if(pybind11_DIR AND NOT DEFINED ASHL_PYBIND11_AUTO_DIR AND EXISTS "${CMAKE_BINARY_DIR}/CMakeCache.txt")
    set(ASHL_PYBIND11_AUTO_DIR "${pybind11_DIR}" CACHE INTERNAL "the pybind11_DIR ashl_find_pybind11 chose itself")
  endif()
  if(pybind11_DIR AND NOT pybind11_DIR STREQUAL "${ASHL_PYBIND11_AUTO_DIR}")
    set(ASHL_PYBIND11_SOURCE explicit)
  else()
    unset(pybind11_DIR CACHE)
    set(ASHL_PYBIND11_SOURCE system)
    if(Python_EXECUTABLE)
      execute_process(COMMAND ${Python_EXECUTABLE} -m pybind11 --cmakedir
                      OUTPUT_VARIABLE _ashl_pb_dir RESULT_VARIABLE _ashl_pb_rc
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(_ashl_pb_rc EQUAL 0 AND EXISTS "${_ashl_pb_dir}")
        set(pybind11_DIR "${_ashl_pb_dir}" CACHE PATH "pybind11's CMake config" FORCE)
        set(ASHL_PYBIND11_SOURCE interpreter)
      endif()
    endif()
  endif()

  find_package(pybind11 2.6 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    set(${problem_var} "pybind11 not found for ${Python_EXECUTABLE} (pip install 'pybind11>=${ASHL_PYBIND11_NUMPY2_MIN}' into that environment: it is in pyproject.toml's [build-system] requires, which pip --no-build-isolation does not install; or apt-get install pybind11-dev python3-dev; or -Dpybind11_DIR=$(python -m pybind11 --cmakedir))")
  else()
    if(NOT ASHL_PYBIND11_SOURCE STREQUAL "explicit")
      set(ASHL_PYBIND11_AUTO_DIR "${pybind11_DIR}" CACHE INTERNAL "the pybind11_DIR ashl_find_pybind11 chose itself")
    endif()
    if(pybind11_VERSION VERSION_LESS ASHL_PYBIND11_NUMPY2_MIN)
      execute_process(COMMAND ${Python_EXECUTABLE} -c "import numpy; print(numpy.__version__)"
                      OUTPUT_VARIABLE _ashl_pb_numpy RESULT_VARIABLE _ashl_pb_rc
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(_ashl_pb_rc EQUAL 0 AND _ashl_pb_numpy VERSION_GREATER_EQUAL 2)
        set(${problem_var} "pybind11 ${pybind11_VERSION} (${pybind11_DIR}) cannot read numpy ${_ashl_pb_numpy}'s arrays (${Python_EXECUTABLE}); with numpy 2 it takes pybind11 >= ${ASHL_PYBIND11_NUMPY2_MIN}: pip install 'pybind11>=${ASHL_PYBIND11_NUMPY2_MIN}' into that environment, or pip install 'numpy<2'")
      endif()
    endif()
  endif()
endmacro()
