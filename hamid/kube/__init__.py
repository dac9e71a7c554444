"""The one Kubernetes layer every face uses: the API client factory
(:mod:`.client`), shared list-and-watch caches per kind with change events
(:mod:`.informer`), and the Events hamid writes on pods (:mod:`.events`).
Quantities are :mod:`hamid.request.quantity`'s. A shared library: it imports
no face."""
