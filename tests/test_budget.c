/*
 * test_budget.c - unit tests of the memory budget (server/zs_budget.c):
 * take/give accounting and its refusal message, the size parser, and a sane
 * default from the host's memory.
 */
#include <stdio.h>
#include <string.h>

#include "zs_budget.h"
#include "zs_test.h"

static void parse_ok(const char *s, uint64_t want)
{
    uint64_t v = 0;
    TEST_CHECKF(zs_budget_parse(s, &v) == 0 && v == want, "'%s' -> %llu, want %llu", s,
                (unsigned long long)v, (unsigned long long)want);
}

static void parse_bad(const char *s)
{
    uint64_t v = 12345;
    TEST_CHECKF(zs_budget_parse(s, &v) != 0 && v == 12345, "'%s' accepted", s);
}

int main(void)
{
    zs_budget_t b;
    zs_err_t err;
    zs_err_clear(&err);
    zs_budget_init(&b, 1000);
    uint64_t used, limit;
    TEST_OK(zs_budget_take(&b, 600, "a", &err), err);
    TEST_OK(zs_budget_take(&b, 0, "nothing", &err), err);
    TEST_OK(zs_budget_take(&b, 400, "b", &err), err); /* exactly full */
    TEST_CHECK(zs_budget_take(&b, 1, "one byte more", &err) == ZS_ERR_NOMEM);
    TEST_CHECK(strstr(err.msg, "one byte more needs") && strstr(err.msg, "--mem-budget"));
    zs_budget_get(&b, &used, &limit);
    TEST_CHECK(used == 1000 && limit == 1000);
    zs_budget_give(&b, 400);
    TEST_CHECK(zs_budget_take(&b, UINT64_MAX, "huge", &err) == ZS_ERR_NOMEM); /* no overflow */
    TEST_CHECK(zs_budget_take(&b, UINT64_MAX - 500, "huge", &err) == ZS_ERR_NOMEM);
    TEST_OK(zs_budget_take(&b, 400, "c", &err), err);
    zs_budget_give(&b, 1000);
    zs_budget_get(&b, &used, &limit);
    TEST_CHECK(used == 0);
    zs_budget_deinit(&b);
    printf("ok  take/give: exact fit, refusal past the limit, no overflow\n");

    parse_ok("1", 1);
    parse_ok("4096", 4096);
    parse_ok("64K", 64ull << 10);
    parse_ok("64kb", 64ull << 10);
    parse_ok("800M", 800ull << 20);
    parse_ok("800MiB", 800ull << 20);
    parse_ok("12G", 12ull << 30);
    parse_ok("1.5T", 3ull << 39);
    parse_bad("");
    parse_bad("0");
    parse_bad("-5G");
    parse_bad("12X");
    parse_bad("G");
    parse_bad("12G extra");
    parse_bad("nan");
    parse_bad("1e30");
    printf("ok  sizes: K/M/G/T (binary), optional B/iB; zero, negative, junk refused\n");

    uint64_t ram = 0, d = zs_budget_default(&ram);
    printf("ok  default budget %.2f GiB of %.2f GiB\n", d / 1073741824.0, ram / 1073741824.0);
    TEST_CHECK(ram >= (64ull << 20) && d == ram / 5 * 4);
    printf("PASS test_budget\n");
    return 0;
}
