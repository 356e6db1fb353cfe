"""APIs that are not yet stable. Anything here may change without notice; the API spec
lists it marked [unstable]. Stable APIs graduate to their home module.

- `func`: function transforms over the tape autograd (`grad`, `value_and_grad`, `vjp`,
  `jvp`, `jacrev`, `hessian`), eager and under `sampan.jit`.
"""

from . import func
from .func import grad, hessian, jacrev, jvp, value_and_grad, vjp

__all__: list[str] = ["func", "grad", "hessian", "jacrev", "jvp", "value_and_grad", "vjp"]
