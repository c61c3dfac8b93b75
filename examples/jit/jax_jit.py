"""JAX jit on the GPU (XLA compiles to PTX/cubin at run time); run and check."""

import jax
import jax.numpy as jnp

f = jax.jit(lambda x: x * 2 + 1)
y = f(jnp.arange(32))
assert int(y.sum()) == 2 * sum(range(32)) + 32
print(jax.__version__, jax.devices("gpu"), "ok")
