# Writes ${OUT} with the current git commit, only when it changed (so no needless rebuilds).
# TWELL_COMMIT in the build's environment wins (the GPU machine's copy of the tree has no .git of
# its own, or a stale one: scripts/gpu-check exports the hash it was given).
if(NOT "$ENV{TWELL_COMMIT}" STREQUAL "")
  set(commit "$ENV{TWELL_COMMIT}")
else()
  execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT commit)
    set(commit unknown)
  endif()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(dirty)
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "#define TWELL_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
