"""Benchmarks of torch_aot_rt's runtime wrapper against upstream's (a package so
that its modules do not collide with tests/ helpers of the same name)."""
