"""The one Kubernetes layer every face uses: the API client factory
(:mod:`.client`: the official client's configuration), JSON requests and
watches on the trio loop (:mod:`.rest`), shared list-and-watch caches per kind
with change events (:mod:`.informer`), the Events hamid writes on pods
(:mod:`.events`), the Lease election among the daemons and the leader's pod
label (:mod:`.election`), and the gossip seeds found through the API
(:mod:`.seeds`). Quantities are :mod:`hamid.request.quantity`'s. A shared
library: it imports no face."""
