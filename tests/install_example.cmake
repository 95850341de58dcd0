# The test `install_example`: installs the build into a scratch prefix, then builds and runs
# examples/ffn_forward and examples/generate (C++) and examples/c_api (C, over libtwell_c.so)
# against it with find_package(twell), as a user's project would.
# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -P install_example.cmake
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_example.cmake: -D${v}= is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_example: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run_step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/twell/version.h include/twell/cpu/ffn.h include/twell/c_api.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install_example: ${f} was not installed")
  endif()
endforeach()
run_step("configuring the example" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/ffn_forward -B ${WORK_DIR}/build
         -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix})
run_step("building the example" ${CMAKE_COMMAND} --build ${WORK_DIR}/build --config Release)
set(exe ${WORK_DIR}/build/ffn_forward)
if(NOT EXISTS ${exe})  # a multi-config generator's folder
  set(exe ${WORK_DIR}/build/Release/ffn_forward)
endif()
run_step("running the example" ${exe})
message(STATUS "${step_output}")
if(NOT step_output MATCHES "non-zeros a token on the CPU" OR NOT step_output MATCHES "models would run on the ")
  message(FATAL_ERROR "install_example: unexpected output:\n${step_output}")
endif()

# A language model through the C++ API (examples/generate), on the random model it writes itself.
run_step("configuring the generate example" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/generate
         -B ${WORK_DIR}/build-generate -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX}
         -DCMAKE_PREFIX_PATH=${prefix})
run_step("building the generate example" ${CMAKE_COMMAND} --build ${WORK_DIR}/build-generate --config Release)
set(exe ${WORK_DIR}/build-generate/generate)
if(NOT EXISTS ${exe})
  set(exe ${WORK_DIR}/build-generate/Release/generate)
endif()
run_step("running the generate example" ${exe})
message(STATUS "${step_output}")
if(NOT step_output MATCHES "prompt perplexity" OR NOT step_output MATCHES "layer 1: .* FFN neurons active a token")
  message(FATAL_ERROR "install_example: unexpected output of the generate example:\n${step_output}")
endif()

# The C interface from a C program (examples/c_api), against the installed libtwell_c.so.
run_step("configuring the C example" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/c_api -B ${WORK_DIR}/build-c
         -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix})
run_step("building the C example" ${CMAKE_COMMAND} --build ${WORK_DIR}/build-c --config Release)
set(exe ${WORK_DIR}/build-c/c_api_example)
if(NOT EXISTS ${exe})
  set(exe ${WORK_DIR}/build-c/Release/c_api_example)
endif()
run_step("running the C example" ${exe})
message(STATUS "${step_output}")
if(NOT step_output MATCHES "non-zeros, largest difference" OR NOT step_output MATCHES "refused: ")
  message(FATAL_ERROR "install_example: unexpected output of the C example:\n${step_output}")
endif()
