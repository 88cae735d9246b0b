// The common OpenCV SSIM (the OpenCV docs' getMSSIM: GaussianBlur 11x11 sigma 1.5), the peer
// qeval's SSIM is benchmarked against. Not used by qeval itself.
#pragma once

#include <opencv2/core.hpp>

namespace qeval::bench {

// Mean SSIM over channels of two 8-bit or float images (HWC), computed on the full frame with
// border replication, as the OpenCV tutorial does.
double opencv_ssim(const cv::Mat& a, const cv::Mat& b);

}  // namespace qeval::bench
