# The GPT and engine tests again under a second OpenBLAS kernel family
# (tests/blas_coretype.sh says which and why): a bitwise claim that holds
# only for the kernels of the machine that wrote it fails here, on any CPU.
add_executable(blas_corename blas_corename.c)
target_link_libraries(blas_corename PRIVATE PkgConfig::OPENBLAS)
set(ZS_BLAS_TESTS test_gpt_ops test_gpt_mixed)
if(ZS_GPT_TEST_ENGINE)
  list(APPEND ZS_BLAS_TESTS test_gpt test_gpt_ckpt test_gpt_act16 test_gpt_param16 test_gpt_split
       test_train_ckpt)
endif()
add_test(NAME test_blas_coretype
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/blas_coretype.sh $<TARGET_FILE:blas_corename>
                 ${CMAKE_CURRENT_BINARY_DIR} ${ZS_BLAS_TESTS})
set_tests_properties(test_blas_coretype PROPERTIES TIMEOUT 1200 LABELS integration
                     SKIP_RETURN_CODE 77)
