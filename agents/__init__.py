"""Every process that talks to NATS: the embedded server launcher (natsd), the bus
(streams, subjects, atomic batches), the scheduler, the GPU host agent, the job SDK with
its checkpoint store, the demo and the bus benchmark. Imports core; core never imports
this."""
