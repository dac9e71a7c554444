"""The admission webhook face: every GPU pod's request checked and mutated at creation (``face``),
and the TLS material the API server needs to call it (``certs``)."""
