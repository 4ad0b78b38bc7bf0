# The fuzz_build test: configures and builds the clang sub-build of the
# fuzz targets (tests/fuzz/CMakeLists.txt), incrementally after the first
# time.
#   cmake -DSOURCE=<tree> -DBUILD=<dir> -DCC=<clang> -P build.cmake
foreach(v SOURCE BUILD CC)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "build.cmake: -D${v}= is required")
  endif()
endforeach()

# -O1 -g without NDEBUG: fast enough, readable stacks, asserts kept.
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD}
          -DCMAKE_C_COMPILER=${CC} -DHISTD_FUZZ=ON
          -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_C_FLAGS_FUZZ=-O1\ -g
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fuzz: configuring the clang sub-build failed")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${BUILD} -j2 --target fuzz_all
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fuzz: building the fuzz targets failed")
endif()
