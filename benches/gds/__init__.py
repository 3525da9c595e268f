"""benches.gds: native GPUDirect Storage qualification of a bare-metal host (see __main__)."""
