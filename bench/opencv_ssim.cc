// OpenCV tutorial SSIM ("Similarity check (PNSR and SSIM) on the GPU/CPU"), written from its formula.
#include "bench/opencv_ssim.h"

#include <opencv2/imgproc.hpp>

namespace qeval::bench {

double opencv_ssim(const cv::Mat& a, const cv::Mat& b) {
  const double c1 = 6.5025, c2 = 58.5225;
  cv::Mat x, y;
  a.convertTo(x, CV_32F);
  b.convertTo(y, CV_32F);
  cv::Mat x2 = x.mul(x), y2 = y.mul(y), xy = x.mul(y);
  cv::Mat mu1, mu2;
  cv::GaussianBlur(x, mu1, cv::Size(11, 11), 1.5);
  cv::GaussianBlur(y, mu2, cv::Size(11, 11), 1.5);
  cv::Mat mu1_2 = mu1.mul(mu1), mu2_2 = mu2.mul(mu2), mu1_mu2 = mu1.mul(mu2);
  cv::Mat s1, s2, s12;
  cv::GaussianBlur(x2, s1, cv::Size(11, 11), 1.5);
  s1 -= mu1_2;
  cv::GaussianBlur(y2, s2, cv::Size(11, 11), 1.5);
  s2 -= mu2_2;
  cv::GaussianBlur(xy, s12, cv::Size(11, 11), 1.5);
  s12 -= mu1_mu2;
  cv::Mat t1 = 2 * mu1_mu2 + c1, t2 = 2 * s12 + c2, t3 = t1.mul(t2);
  t1 = mu1_2 + mu2_2 + c1;
  t2 = s1 + s2 + c2;
  t1 = t1.mul(t2);
  cv::Mat map;
  cv::divide(t3, t1, map);
  cv::Scalar m = cv::mean(map);
  double sum = 0;
  for (int c = 0; c < a.channels(); ++c) sum += m[c];
  return sum / a.channels();
}

}  // namespace qeval::bench
