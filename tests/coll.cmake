# Collectives on a stream over Open MPI (worker/coll: zs_coll.c, zs_coll_mpi.c)
# on the CPU device: test_coll under mpirun with 1, 2 and 4 ranks,
# oversubscribed (CI machines have 2 CPUs) and allowed to run as root (CI runs
# as root; Open MPI refuses it otherwise). test_coll links zs_coll only (the
# device layer, kernels, common and MPI come with it), not libzeroshard.
add_executable(test_coll test_coll.c test_coll_stream.c)
target_include_directories(test_coll PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(test_coll PRIVATE zs_coll)
foreach(np 1 2 4)
  add_test(NAME test_coll_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_coll> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_coll_np${np} PROPERTIES
    TIMEOUT 120 LABELS "unit;mpi"
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_mpi_yield_when_idle=1")
endforeach()
# MPI below MPI_THREAD_SERIALIZED is refused at create.
add_test(NAME test_coll_funneled
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:test_coll> --funneled ${MPIEXEC_POSTFLAGS})
set_tests_properties(test_coll_funneled PROPERTIES
  TIMEOUT 60 LABELS "unit;mpi"
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
