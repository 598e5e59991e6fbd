// Package decode turns the members of WebDataset samples into typed values and
// collates batches of them into slabs: byte buffers (pinned memory, given by the
// caller) that the trainer views as NumPy arrays without copying. It never
// allocates slab memory itself.
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
// # Collation and the slab layout
//
// Collate writes a batch of decoded samples into a slab and returns its Batch
// layout: one Column per field, in order, then "__key__" (the sample keys). Every
// column's data and every offsets array starts at a multiple of Align (64) bytes
// from the start of the slab.
//
//   - KindInt fields: fixed column of int64, shape [rows].
//   - KindNPY fields with a Shape, and KindImage fields: fixed column of the
//     field's dtype, shape [rows, Shape...], C order, rows back to back.
//   - Every other field, and __key__: ragged. Data holds the rows' bytes back to back
//     (for NPY the array data without its header); OffsetsOffset holds rows+1
//     little-endian int64 offsets into Data, offsets[0] = 0, offsets[rows] = Length.
//     DType is uint8 and Shape [Length].
//
// Sizes are computed before anything is written; a batch that does not fit returns
// ErrSlabTooSmall with the bytes needed, leaving the slab untouched.
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
