# Integration tests of zs-server: bearer token and TLS (test_auth), and a
# kill -9 of the server while a checkpoint is being written (test_server_crash).
zs_add_test(test_auth SRCS test_auth.c LIBS zeroshard zs_testproc TIMEOUT 120
            LABELS integration)
zs_add_test(test_server_crash SRCS test_server_crash.c LIBS zeroshard zs_testproc TIMEOUT 180
            LABELS integration)
add_dependencies(test_auth zs-server)
add_dependencies(test_server_crash zs-server)
# A full data disk (a small tmpfs; skipped where it cannot be mounted): the
# store degrades, Hello says so, and checkpoints resume once there is room.
zs_add_test(test_server_disk SRCS test_server_disk.c LIBS zeroshard zs_testproc TIMEOUT 120
            LABELS integration)
add_dependencies(test_server_disk zs-server)
set_tests_properties(test_server_disk PROPERTIES SKIP_RETURN_CODE 77)
# The memory budget (--mem-budget): Initialize claims, SetState buffers and
# waiting pulls beyond it are refused with RESOURCE_EXHAUSTED.
zs_add_test(test_server_budget SRCS test_server_budget.c LIBS zeroshard zs_testproc TIMEOUT 120
            LABELS integration)
add_dependencies(test_server_budget zs-server)
# What waits and what must not: Pulls waiting for a future step end when
# their client cancels or dies; Hello and ListCheckpoints answer during a
# checkpoint write.
zs_add_test(test_server_waits SRCS test_server_waits.c LIBS zeroshard zs_testproc TIMEOUT 120
            LABELS integration)
add_dependencies(test_server_waits zs-server)
# Load: a fuzz-like mix of refused and accepted requests, then 64 concurrent
# clients; the server's memory is printed (issue 9, item 10).
zs_add_test(test_server_load SRCS test_server_load.c LIBS zeroshard zs_testproc TIMEOUT 240
            LABELS integration)
add_dependencies(test_server_load zs-server)
# Speculation under a tight --mem-budget (the state + 8 MiB) never refuses a
# Pull or a GetState that the same budget serves with --spec-window 0, and
# stays bitwise equal to it.
zs_add_test(test_spec_budget SRCS test_spec_budget.c LIBS zeroshard zs_testproc TIMEOUT 180
            LABELS integration)
add_dependencies(test_spec_budget zs-server)
