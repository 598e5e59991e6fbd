// Package turbojpeg decodes JPEG images with libjpeg-turbo's TurboJPEG library,
// loaded when the program runs rather than linked when it is built.
//
// The library is opened with dlopen through a small cgo shim, the way the device
// package loads the CUDA driver: the build needs neither turbojpeg.h nor the
// library, and a machine without libturbojpeg (Debian and Ubuntu: libturbojpeg0)
// gets an error wrapping ErrUnavailable from Open, so callers can fall back to
// image/jpeg. A binary built without cgo, or not for Linux, always gets that error.
//
// Decoding uses the TurboJPEG 2.x API (tjDecompressHeader3, tjDecompress2), which
// libjpeg-turbo 2.0 and later provide, 3.x included. Decode writes packed RGB or
// grayscale pixels into a caller's buffer and can scale by 1/8 to 1 in the inverse
// DCT, which costs less than decoding at full size and resizing afterwards.
//
// Regions (OpenRegions, DefaultRegions) is libjpeg-turbo's libjpeg API,
// libjpeg.so.62, loaded the same way: DecodeRegion decodes only the columns and rows
// of an image that a crop needs (jpeg_crop_scanline, jpeg_skip_scanlines), which
// TurboJPEG 2.x cannot. Its pixels are the full decode's, save for the decoded part's
// first and last columns.
//
// A Lib is safe for concurrent use: it keeps a pool of TurboJPEG instances, one per
// concurrent call, reused from call to call.
package turbojpeg
