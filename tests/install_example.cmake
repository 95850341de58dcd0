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
# Configures examples/<example> against the installed prefix in WORK_DIR/<folder>, builds it, runs
# <exe>, and fails unless its output matches each regular expression after those arguments.
function(build_and_run example folder exe)
  run_step("configuring examples/${example}" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/${example}
           -B ${WORK_DIR}/${folder} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX}
           -DCMAKE_PREFIX_PATH=${prefix})
  run_step("building examples/${example}" ${CMAKE_COMMAND} --build ${WORK_DIR}/${folder} --config Release)
  set(path ${WORK_DIR}/${folder}/${exe})
  if(NOT EXISTS ${path})  # a multi-config generator's folder
    set(path ${WORK_DIR}/${folder}/Release/${exe})
  endif()
  run_step("running examples/${example}" ${path})
  message(STATUS "${step_output}")
  foreach(expected ${ARGN})
    if(NOT step_output MATCHES "${expected}")
      message(FATAL_ERROR "install_example: examples/${example} did not print '${expected}':\n${step_output}")
    endif()
  endforeach()
endfunction()

# One FFN layer on the CPU (and the GPU where there is one).
build_and_run(ffn_forward build ffn_forward "non-zeros a token on the CPU" "models would run on the ")
# A language model through the C++ API, on the random model it writes itself.
build_and_run(generate build-generate generate "prompt perplexity" "layer 1: .* FFN neurons active a token")
# The C interface from a C program, against the installed libtwell_c.so.
build_and_run(c_api build-c c_api_example "non-zeros, largest difference" "refused: ")
