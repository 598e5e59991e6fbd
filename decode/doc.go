// Package decode turns the members of WebDataset samples into typed values, which
// package wire collates into slabs that the trainer views as NumPy arrays without
// copying.
//
// # Fields
//
// A Field names a sample extension and how to decode it: KindRaw (bytes as they
// are), KindNPY (a .npy array, optionally with a required dtype and per-sample
// shape), KindInt (a decimal label, as in .cls), KindText (UTF-8), KindJSON, or
// KindImage (a JPEG, PNG, WebP or GIF decoded, resized and cropped into a fixed
// uint8, float16 or float32 array). Members ending in .gz are inflated first, under a
// size cap against gzip bombs. ParseField reads the --field syntax,
// [NAME=]EXT[:KIND[:DTYPE[:SHAPE[:OPTIONS]]]]:
//
//	label=cls  img=jpg  tokens=npy:npy:int32:2048  caption=txt.gz:text
//	img=jpg:image:uint8:3x224x224:resize=256  img=jpg:image:float16:224x224x3:random-crop,flip,imagenet
//
// # Images
//
// Images are resized with Pillow's bilinear resampler, reimplemented (same taps,
// weights and rounding), so that a center crop is the one torchvision's Resize and
// CenterCrop give on a PIL image, and a random crop is drawn as RandomResizedCrop
// draws it, from a Decoder's Seed (SampleSeed of the job's seed, the epoch and the
// key). JPEGs are decoded by libjpeg-turbo, loaded at run time when present
// (ImageDecoder), or by Go's image/jpeg.
//
// # Decoding
//
// Decoder.Decode (or Field.Decode) checks one member and returns a Value whose Data
// aliases the member's bytes (or the caller's scratch buffer, for inflated members):
// nothing is copied and, in the steady state, nothing is allocated. ParseNPY reads
// .npy versions 1.0 to 3.0 of numeric little-endian C-order arrays; it rejects
// Fortran order, big-endian, and object, string and structured dtypes.
//
// # Errors
//
// Decoding errors are *FieldError values (the field and extension) wrapping
// sentinels: ErrNotInt, ErrNotUTF8, ErrBadJSON, ErrBadNPY, ErrWrongDType,
// ErrWrongShape, ErrTooLarge, ErrCorrupt, ErrBadImage; callers report a missing
// member as a FieldError wrapping ErrMissing. All of them concern one sample: the pipeline's
// error policy decides whether to skip it or fail.
//
// # Concurrency
//
// Fields, once built, are read-only and may be shared. A Decoder holds scratch
// state: use one per goroutine.
package decode
