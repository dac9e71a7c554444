/*
 * next_a.c: TEST STAND-IN ONLY. Defines probe() and asks dlsym(RTLD_NEXT)
 * for the next probe(), which next_b.c defines; if the shim's dlsym lost the
 * caller's identity, RTLD_NEXT would resolve relative to the shim instead.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
int probe(void) { return 1; }
int probe_via_next(void)
{
    int (*p)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    return p ? p() : -1;
}
