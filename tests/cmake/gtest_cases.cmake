# Read by ctest (a TEST_INCLUDE_FILES script written by easyctx_add_test): adds one ctest
# entry per GoogleTest case of one binary, named ENTRY:Suite.Case, each run through
# tests/gtest_run.sh so that a skipped case shows as "Skipped" and not as "Passed" (a GPU
# binary where no GPU is visible: one entry, ENTRY:all-cases, below). The case
# list comes from BINARY --gtest_list_tests ARGS, kept in the ctest folder until the binary is
# rebuilt or ARGS change. A binary that is not built, or lists no case, is one failing entry.
# Set before including: EASYCTX_T_{ENTRY,EXE,LAUNCH,ARGS,LABELS,TIMEOUT,PROCESSORS,COST,ENV,
# WORKDIR,RESULTS,RUN,BASH}.
if(NOT EXISTS "${EASYCTX_T_EXE}")
  add_test("${EASYCTX_T_ENTRY}_NOT_BUILT" "${EASYCTX_T_EXE}")
  set_tests_properties("${EASYCTX_T_ENTRY}_NOT_BUILT" PROPERTIES LABELS "${EASYCTX_T_LABELS}")
else()
  string(MD5 _easyctx_key "${EASYCTX_T_ARGS}")
  get_filename_component(_easyctx_list "${EASYCTX_T_EXE}" NAME)
  set(_easyctx_list "${EASYCTX_T_WORKDIR}/${_easyctx_list}-${_easyctx_key}.cases")
  set(_easyctx_rc 0)
  if(NOT EXISTS "${_easyctx_list}" OR "${EASYCTX_T_EXE}" IS_NEWER_THAN "${_easyctx_list}")
    execute_process(COMMAND "${EASYCTX_T_EXE}" --gtest_list_tests ${EASYCTX_T_ARGS}
                    WORKING_DIRECTORY "${EASYCTX_T_WORKDIR}" TIMEOUT 120
                    OUTPUT_VARIABLE _easyctx_out ERROR_VARIABLE _easyctx_err RESULT_VARIABLE _easyctx_rc)
    if(_easyctx_rc EQUAL 0)
      file(WRITE "${_easyctx_list}" "${_easyctx_out}")
    endif()
  else()
    file(READ "${_easyctx_list}" _easyctx_out)
  endif()
  set(_easyctx_cases)
  if(_easyctx_rc EQUAL 0)
    # "Suite.\n  Case\n  Case2  # GetParam() = ...\n": no list brackets or semicolons here.
    string(REPLACE ";" "," _easyctx_out "${_easyctx_out}")
    string(REPLACE "[" "(" _easyctx_out "${_easyctx_out}")
    string(REPLACE "]" ")" _easyctx_out "${_easyctx_out}")
    string(REPLACE "\n" ";" _easyctx_lines "${_easyctx_out}")
    set(_easyctx_suite "")
    foreach(_easyctx_line IN LISTS _easyctx_lines)
      string(REGEX REPLACE " *#.*$" "" _easyctx_line "${_easyctx_line}")
      if(_easyctx_line MATCHES "^([^ ].*)\\.$")
        set(_easyctx_suite "${CMAKE_MATCH_1}")
      elseif(_easyctx_line MATCHES "^  +([^ ]+)$" AND NOT _easyctx_suite STREQUAL "")
        list(APPEND _easyctx_cases "${_easyctx_suite}.${CMAKE_MATCH_1}")
      endif()
    endforeach()
  endif()
  if(NOT _easyctx_rc EQUAL 0 OR NOT _easyctx_cases)
    # ran 0 cases: a failure, with the reason in its output
    set(_easyctx_name "${EASYCTX_T_ENTRY}_NO_CASES")
    set(_easyctx_msg "${EASYCTX_T_EXE} --gtest_list_tests ${EASYCTX_T_ARGS}: exit status ${_easyctx_rc}")
    add_test("${_easyctx_name}" "${EASYCTX_T_BASH}" -c "echo '${_easyctx_msg}, no test case to run'; exit 1")
    set_tests_properties("${_easyctx_name}" PROPERTIES LABELS "${EASYCTX_T_LABELS}")
  endif()
  # A GPU binary on a machine without a GPU (nvidia-smi lists none, as tests/test_report.sh
  # decides): one entry for all its cases, ENTRY:all-cases. Every case skips there, and each
  # still shows in the case counts (its XML report); what goes is a process start per case
  # (~1 s of loading the CUDA libraries, two minutes of CI's run over all of them).
  set(_easyctx_whole FALSE)
  list(FIND EASYCTX_T_LABELS gpu _easyctx_gpu)  # (no IN_LIST: ctest runs this with old policies)
  if(_easyctx_cases AND NOT _easyctx_gpu EQUAL -1)
    set(_easyctx_whole TRUE)
    find_program(_easyctx_smi nvidia-smi)
    if(_easyctx_smi)
      execute_process(COMMAND "${_easyctx_smi}" -L OUTPUT_VARIABLE _easyctx_smi_out ERROR_QUIET TIMEOUT 30)
      if(_easyctx_smi_out MATCHES "(^|\n)GPU ")
        set(_easyctx_whole FALSE)
      endif()
    endif()
  endif()
  if(_easyctx_whole)
    set(_easyctx_cases all-cases)  # the one entry, run without a case filter below
  endif()
  foreach(_easyctx_case IN LISTS _easyctx_cases)
    set(_easyctx_name "${EASYCTX_T_ENTRY}:${_easyctx_case}")
    string(REPLACE "/" "_" _easyctx_file "${_easyctx_case}")
    set(_easyctx_filter "--gtest_filter=${_easyctx_case}")
    if(_easyctx_whole)
      set(_easyctx_filter)
    endif()
    add_test("${_easyctx_name}" "${EASYCTX_T_BASH}" "${EASYCTX_T_RUN}"
             "${EASYCTX_T_RESULTS}/${EASYCTX_T_ENTRY}/${_easyctx_file}.xml" --
             ${EASYCTX_T_LAUNCH} "${EASYCTX_T_EXE}" ${EASYCTX_T_ARGS} ${_easyctx_filter})
    set_tests_properties("${_easyctx_name}" PROPERTIES
      LABELS "${EASYCTX_T_LABELS}" TIMEOUT "${EASYCTX_T_TIMEOUT}" PROCESSORS "${EASYCTX_T_PROCESSORS}" COST "${EASYCTX_T_COST}"
      ENVIRONMENT "${EASYCTX_T_ENV}" WORKING_DIRECTORY "${EASYCTX_T_WORKDIR}" SKIP_RETURN_CODE 77)
  endforeach()
endif()
