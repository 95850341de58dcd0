# Writes ${OUT} with the current git commit (and "-dirty" for uncommitted changes); rewrites it
# only when it changes, so builds stay incremental. Run at every build by target twell_git_sha.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE sha OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR sha STREQUAL "")
  set(sha "unknown")
endif()
set(content "#pragma once\n#define TWELL_GIT_SHA \"${sha}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
