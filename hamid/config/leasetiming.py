"""client-go's rule for leader election timing, alone so that validating the
config costs no trio import: ``leaseDuration > renewDeadline > 1.2 x
retryPeriod > 0``, the lease counted in the whole seconds a Lease records."""

from __future__ import annotations

from ..errors import HamidError

JITTER_FACTOR = 1.2  # client-go's JitterFactor: a candidate waits retryPeriod x (1 + up to 1.2)


class ElectionConfigError(HamidError):
    """Leader election settings that cannot work together."""


def validate_timing(lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    if retry_period <= 0:
        raise ElectionConfigError(f"leaderElectionRetryPeriod {retry_period} s: must be > 0")
    if lease_duration != int(lease_duration) or lease_duration < 1:
        raise ElectionConfigError(f"leaderElectionLeaseDuration {lease_duration} s: the Lease records whole "
                                  "seconds, so it must be a whole number of seconds, at least 1")
    if not renew_deadline > JITTER_FACTOR * retry_period:
        raise ElectionConfigError(
            f"leaderElectionRenewDeadline {renew_deadline} s must be greater than {JITTER_FACTOR} x "
            f"leaderElectionRetryPeriod ({retry_period} s = {JITTER_FACTOR * retry_period:g} s): a renewal needs "
            "room for at least one retry")
    if not int(lease_duration) > renew_deadline:
        raise ElectionConfigError(
            f"leaderElectionLeaseDuration {lease_duration} s must be greater than leaderElectionRenewDeadline "
            f"{renew_deadline} s: a leader must give up before the others may take over")
