"""Process autoscaling on lag: ``conveyor worker APP --processes MIN:MAX``.

The supervisor starts ``MIN`` daemon processes, hands each its share of the app's
queues, and every inspection period reads the consumer lag of every queue from the
broker: it starts one more process (up to ``MAX``) when the lag per process stays high,
and drains and stops an idle one (down to ``MIN``) when the PID scale-down controller
says so. A queue moves only once its owner has drained and released it, so no queue is
ever pulled by two processes. Lag must be shared across processes, so this needs a
broker adapter (redis, kafka); the in-process memory adapter is refused.

* ``run.py``         :func:`run_supervisor` — what the CLI calls: signals, the HTTP
                     endpoint, the drain reports added up
* ``supervisor.py``  :class:`~.supervisor.Supervisor` — the loop: inspect, scale,
                     replace dead processes
* ``scaler.py``      :class:`~.scaler.LagScaler` — when to add or remove a process
                     (pure), and the settings
* ``assignment.py``  which process pulls which queue, and how a queue moves
* ``process.py``     :class:`~.process.ChildProcess` — one child as the supervisor
                     holds it: start, commands, stop
* ``protocol.py``    the typed messages both ends exchange, one JSON line each
* ``child.py``       the child process: a daemon whose queues the supervisor hands out
* ``endpoint.py``    the one ``/metrics`` and probes endpoint, children's merged in
"""

from conveyor.workers.supervisor.run import parse_processes, run_supervisor

__all__ = ["parse_processes", "run_supervisor"]
