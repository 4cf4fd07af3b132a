# A run that survives kill -9s: zs-launch + zs-train + 2 zs-server, 20 random
# kills of servers and workers over the shared-memory data plane, bitwise
# equal to an undisturbed run over TCP; a kill -9 of one server, RAM and NVMe
# tier (--nvme-path), recovered in-job.
zs_add_test(test_chaos SRCS test_chaos.c LIBS zs_testproc TIMEOUT 600 LABELS integration)
target_compile_definitions(test_chaos PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>"
                           ZS_LAUNCH="$<TARGET_FILE:zs-launch>"
                           ZS_CTL="$<TARGET_FILE:zs-ctl>")
add_dependencies(test_chaos zs-train zs-tokenize zs-server zs-launch zs-ctl)

# zs-launch's rules (reruns, --resume-auto, statuses it does not rerun,
# shrinking) with a stand-in launcher script: no MPI.
zs_add_test(test_launch SRCS test_launch.c LIBS zs_testproc TIMEOUT 60 LABELS unit)
target_compile_definitions(test_launch PRIVATE ZS_LAUNCH="$<TARGET_FILE:zs-launch>")
add_dependencies(test_launch zs-launch)
