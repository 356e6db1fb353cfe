"""APIs that are not yet stable. Anything here may change without notice; the API spec
lists it marked [unstable]. Stable APIs graduate to their home module.

- `func`: function transforms over the tape autograd (`grad`, `value_and_grad`, `vjp`,
  `jvp`, `jacrev`, `hessian`), eager and under `sampan.jit`, and `functional_call` to
  apply them to a Layer's weights.
- `vmap`: map a function over a batch dim (per entry and stacked; composes with `grad`).
"""

from . import func
from .func import functional_call, grad, hessian, jacrev, jvp, value_and_grad, vjp
from .vmap import vmap

__all__: list[str] = ["func", "functional_call", "grad", "hessian", "jacrev", "jvp",
                      "value_and_grad", "vjp", "vmap"]
