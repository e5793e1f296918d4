"""Which daemon pulls which queue: balancers, leases, membership, placement, their maths."""
