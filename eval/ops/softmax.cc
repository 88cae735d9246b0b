// Softmax and LogSoftmax (opset < 13: 2-D coercion; 13+: one axis).
#include "eval/ops/families.h"

namespace qeval::eval {

void register_softmax_ops(std::vector<OpSchema>& out) {
  (void)out;  // no ops yet
}

}  // namespace qeval::eval
