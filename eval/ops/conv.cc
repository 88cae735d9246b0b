// Conv (groups, dilations, pads, auto_pad) and ConvTranspose.
#include "eval/ops/families.h"

namespace qeval::eval {

void register_conv_ops(std::vector<OpSchema>& out) {
  (void)out;  // no ops yet
}

}  // namespace qeval::eval
