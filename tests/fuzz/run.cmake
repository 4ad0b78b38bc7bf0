# One fuzz test: runs a libFuzzer target for a bounded time.
#   cmake -DFUZZER=<binary> -DSEEDS=<dir> -DREGRESSIONS=<dir> -DWORK=<dir>
#         -DSECONDS=<n> [-DDICT=<file>] [-DQUIET=1] -P run.cmake
#
# 1. Every regression input (tests/fuzz/regressions/<target>/: inputs that
#    once crashed) runs once: any failure fails the test.
# 2. Then the target fuzzes for SECONDS, in this one process, starting
#    from the seeds and the regression inputs. Seeds and regressions are
#    read only: new inputs go to WORK/corpus, crashes to WORK/artifacts
#    (emptied first; the test prints their paths). WORK/corpus is kept
#    between runs, so each run starts where the last stopped.
# QUIET: the target's own stderr is discarded (the file driver logs a line
# at every close); libFuzzer's and the sanitizers' reports still show.
# SEED: libFuzzer's -seed (0: a new random one each run). A fixed seed
# makes the run a gate: the same inputs in the same order on every machine
# (a slower machine runs a prefix of them), so what passed here passes in
# CI; wider searches are run by hand (README).
foreach(v FUZZER SEEDS REGRESSIONS WORK SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake: -D${v}= is required")
  endif()
endforeach()

# -timeout: one input taking a minute is a hang; less would flag a stall of
# this machine under load (seen: 32 s for an input that takes 40 ms).
file(REMOVE_RECURSE ${WORK}/artifacts)
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
set(ENV{ASAN_OPTIONS} "detect_leaks=1")

set(common -rss_limit_mb=2048 -timeout=60 -artifact_prefix=${WORK}/artifacts/)
if(QUIET)
  list(APPEND common -close_fd_mask=2)
endif()
if(DICT)
  list(APPEND common -dict=${DICT})
endif()
if(DEFINED SEED AND NOT SEED EQUAL 0)
  list(APPEND common -seed=${SEED})
endif()

file(GLOB regressions ${REGRESSIONS}/*)
list(FILTER regressions EXCLUDE REGEX "/README[^/]*$")
if(regressions)
  execute_process(COMMAND ${FUZZER} ${common} -runs=1 ${regressions}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz: a regression input of ${REGRESSIONS} fails "
                        "again (rc ${rc})")
  endif()
endif()

set(dirs ${WORK}/corpus ${SEEDS})
if(IS_DIRECTORY ${REGRESSIONS})
  list(APPEND dirs ${REGRESSIONS})
endif()
execute_process(
  COMMAND ${FUZZER} ${common} -max_total_time=${SECONDS} -print_final_stats=1
          ${dirs}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(GLOB found ${WORK}/artifacts/*)
  message(FATAL_ERROR "fuzz: ${FUZZER} found a failure (rc ${rc}); the "
                      "input is in ${found}. Fix it and keep the input in "
                      "${REGRESSIONS}/ (see tests/fuzz/README.md).")
endif()
