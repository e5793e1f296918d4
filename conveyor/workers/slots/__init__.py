"""The slot suppliers that come with Conveyor (the port is :mod:`conveyor.platform.slots`).

* ``fixed.py``     :class:`~conveyor.workers.slots.fixed.FixedSlotSupplier` — a set
                   number of slots
* ``resource.py``  :class:`~conveyor.workers.slots.resource.ResourceBasedSlotSupplier` —
                   more slots while CPU and memory have room (samples from
                   :mod:`conveyor.workers.resources`)
* ``wrappers.py``  suppliers around another: pauseable, and the guard for user code
* ``rate.py``      :class:`~conveyor.workers.slots.rate.RateLimitedSlotSupplier` — a
                   wrapper that also needs a token per start (``[slots.rate]``)
* ``build.py``     :func:`~conveyor.workers.slots.build.supplier_from_config` — the
                   supplier a ``[slots]`` section describes, user-written ones included
"""
