# The smoke subset, ctest label "quick" (./tests/run.sh --quick): every
# unit test, one server integration test (2 servers, 2 clients, kill -9,
# restore: test_server) and one emulated-GPU test (the CUDA device on the
# emulator: emu_test_dev_cuda). Under 3 minutes on 2 cores once built.
# Included last, so that every test it labels exists.
get_property(zs_all_tests DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} PROPERTY TESTS)
foreach(t ${zs_all_tests})
  get_test_property(${t} LABELS labels)
  if("unit" IN_LIST labels AND NOT t IN_LIST ZS_QUICK_EXCLUDE)
    set_property(TEST ${t} APPEND PROPERTY LABELS quick)
  endif()
endforeach()
foreach(t test_server emu_test_dev_cuda)
  if(t IN_LIST zs_all_tests)
    set_property(TEST ${t} APPEND PROPERTY LABELS quick)
  endif()
endforeach()

# Last of all: nothing of the shared-memory data plane outlives the tests
# (tests/test_shm_leftovers.sh). DEPENDS orders it after every other test.
add_test(NAME test_shm_leftovers COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_shm_leftovers.sh)
set_tests_properties(test_shm_leftovers PROPERTIES TIMEOUT 60 LABELS "integration;quick"
                     SKIP_RETURN_CODE 77 DEPENDS "${zs_all_tests}")
