# The RocksDB checkpoint store (zs_store.h): its own static library so tests,
# benchmarks and tools use it without gRPC.
add_library(zs_store STATIC zs_store.c zs_store_io.c zs_store_recover.c)
target_include_directories(zs_store PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_include_directories(zs_store PRIVATE ${ROCKSDB_INCLUDE})
target_link_libraries(zs_store PUBLIC zs_common zs_hash ${ROCKSDB_LIB} PkgConfig::XXHASH)
