// MatMul (batched, broadcast), Gemm, Einsum (matmul-shaped equations).
#include "eval/ops/families.h"

namespace qeval::eval {

void register_matmul_ops(std::vector<OpSchema>& out) {
  (void)out;  // no ops yet
}

}  // namespace qeval::eval
