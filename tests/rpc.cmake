# proto/, server/ and the client: unit tests and integration tests with real
# zs-server processes on 127.0.0.1.
add_library(zs_testproc STATIC zs_proc.c)
target_compile_definitions(zs_testproc PRIVATE ZS_BINARY_DIR="${PROJECT_BINARY_DIR}")
target_include_directories(zs_testproc PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})

zs_add_test(test_server SRCS test_server.c LIBS zeroshard zs_testproc TIMEOUT 600
            LABELS integration)
set_tests_properties(test_server PROPERTIES DEPENDS zs-server)
