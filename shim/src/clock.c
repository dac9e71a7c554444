/*
 * clock.c: the shim's clocks and sleeps. Every reading of time (monotonic and
 * wall-clock ns) and every wait of the shim goes through here, so that a test
 * build (-DHAMID_TEST_CLOCK) can take them from the stand-in driver's virtual
 * clock (tests/shim/csrc/fake_clock.h): rates checked on simulated time, the
 * same however busy the machine. The release build reads the kernel's clocks
 * directly and compiles none of the hook.
 */
#include "shim.h"

#include <errno.h>
#include <time.h>

#ifdef HAMID_TEST_CLOCK
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

HIDDEN void *hamid_real_dlsym_addr(void);

/* The stand-in driver's clock, resolved once from the libcuda.so.1 the process loads (the fake's). */
static struct {
    uint64_t (*mono)(void);
    uint64_t (*real)(void);
    void (*sleep_until)(uint64_t);
} g_test_clock;
static pthread_once_t g_test_clock_once = PTHREAD_ONCE_INIT;

static void test_clock_resolve(void)
{
    void *(*ds)(void *, const char *) = (void *(*)(void *, const char *))hamid_real_dlsym_addr();
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    if (h && ds) {
        g_test_clock.mono = (uint64_t (*)(void))ds(h, "fake_clock_mono_ns");
        g_test_clock.real = (uint64_t (*)(void))ds(h, "fake_clock_real_ns");
        g_test_clock.sleep_until = (void (*)(uint64_t))ds(h, "fake_clock_sleep_until");
    }
    if (!g_test_clock.mono || !g_test_clock.real || !g_test_clock.sleep_until) {
        /* a test build that silently ran on the real clock would pass rate tests by luck */
        LOG_ERR("test clock: libcuda.so.1 (%s) has no fake_clock_* functions; this shim build runs only on the "
                "stand-in driver", h ? "loaded" : dlerror());
        abort();
    }
}
#define TEST_CLOCK(f) (pthread_once(&g_test_clock_once, test_clock_resolve), g_test_clock.f)
#endif

HIDDEN uint64_t mono_ns(void)
{
#ifdef HAMID_TEST_CLOCK
    return TEST_CLOCK(mono)();
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

HIDDEN uint64_t real_ns(void)
{
#ifdef HAMID_TEST_CLOCK
    return TEST_CLOCK(real)();
#endif
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

HIDDEN void sleep_until_ns(uint64_t t)
{
#ifdef HAMID_TEST_CLOCK
    TEST_CLOCK(sleep_until)(t);
    return;
#endif
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

HIDDEN void sleep_for_ns(uint64_t d)
{
#ifdef HAMID_TEST_CLOCK
    TEST_CLOCK(sleep_until)(mono_ns() + d);
    return;
#endif
    struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
    nanosleep(&ts, NULL);
}
