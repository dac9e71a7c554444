/* next_b.c: TEST STAND-IN ONLY. The probe() that RTLD_NEXT from next_a.c must find. */
int probe(void) { return 2; }
