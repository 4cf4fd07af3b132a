# The documents stand alone: every relative link in the Markdown files
# resolves (anchors included), and nothing refers outside the repository
# (tests/check_docs.py says what it checks and what it does not).
add_test(NAME test_docs COMMAND ${ZS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_docs.py
                                ${PROJECT_SOURCE_DIR})
set_tests_properties(test_docs PROPERTIES TIMEOUT 60 LABELS unit)
