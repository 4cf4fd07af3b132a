# The zeroshard Python package (python/): tests/test_python.py against real
# zs-server processes on 127.0.0.1 with Debian's python3-torch. Skips (77,
# saying why) without torch or without the extension (no python3-dev, or
# ZS_WITH_PYTHON=OFF).
add_test(NAME test_python
         COMMAND ${ZS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_python.py --build ${PROJECT_BINARY_DIR})
set_tests_properties(test_python PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS integration)
