/*
 * fake_unrelated.c: TEST STAND-IN ONLY. A library whose functions merely
 * share the "cu" prefix (cuDNN, cuBLAS, curl) or even a driver name, built by
 * tests/shim to prove the shim's dlsym never hijacks them.
 */
int cudnnCreate(void) { return 11; }
int cublasCreate_v2(void) { return 22; }
int curl_easy_init(void) { return 33; }
int cuMemAlloc_v2(void) { return 44; }
