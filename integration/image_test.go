package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/testutil"
)

// Image fields against PIL: the references come from bench/pil_reference.py (PIL's
// Image.open().convert("RGB"), resize of the shorter side with Image.BILINEAR,
// center crop, as torchvision's Resize + CenterCrop do), the shards from
// bench/make_image_shards.py (photo-like JPEGs encoded by PIL) and the real tarproc
// shard (PNGs written by another project).

var (
	makeImageShards = func() string { p, _ := filepath.Abs("../bench/make_image_shards.py"); return p }()
	pilReference    = func() string { p, _ := filepath.Abs("../bench/pil_reference.py"); return p }()
	imageCheck      = func() string { p, _ := filepath.Abs("../client/python/tests/image_check.py"); return p }()
)

// pythonPIL returns the interpreter with numpy, PIL and torch, failing in CI when
// they are missing and skipping loudly elsewhere.
func pythonPIL(t *testing.T) string {
	t.Helper()
	py := python(t)
	if out, err := exec.Command(py, "-c", "import PIL, torchvision").CombinedOutput(); err != nil {
		msg := "PIL and torchvision are needed (scripts/deps.sh installs python3-pil and python3-torchvision): " + err.Error() + ": " + string(out)
		if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	return py
}

func runPy(t *testing.T, py string, args ...string) []byte {
	t.Helper()
	// A guard against a hang, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v\n%s", py, strings.Join(args, " "), err, stderr)
	}
	return out
}

// photoShards writes shards of photo-like JPEGs encoded by PIL and returns their
// paths.
func photoShards(t *testing.T, py, dir string, shards, samples int, args ...string) []string {
	t.Helper()
	runPy(t, py, append([]string{makeImageShards, dir, "--shards", itoa(int64(shards)), "--samples-per-shard", itoa(int64(samples))}, args...)...)
	paths, err := filepath.Glob(filepath.Join(dir, "images-*.tar"))
	if err != nil || len(paths) != shards {
		t.Fatalf("%d shards in %s: %v", len(paths), dir, err)
	}
	return paths
}

// references returns PIL's center crops of the shards' members with extension ext,
// by sample key.
func references(t *testing.T, py, ext string, resize int, shards []string) map[string][]byte {
	t.Helper()
	out := t.TempDir()
	args := []string{pilReference, "--size", "224", "--ext", ext, "--out", out}
	if resize > 0 {
		args = append(args, "--resize", itoa(int64(resize)))
	}
	runPy(t, py, append(args, shards...)...)
	files, _ := filepath.Glob(filepath.Join(out, "*.npy"))
	refs := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		a, err := decode.ParseNPY(data)
		if err != nil || a.DType != decode.Uint8 || len(a.Shape) != 3 || a.Shape[0] != 224 || a.Shape[1] != 224 || a.Shape[2] != 3 {
			t.Fatalf("%s: %v %v", f, a.Shape, err)
		}
		key := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(f), ".npy"), "__", "/")
		refs[key] = a.Data
	}
	return refs
}

// loaderImages reads one epoch of the shards with field spec through the library
// and returns the image column's rows by key.
func loaderImages(t *testing.T, shards []string, spec string, dec decode.ImageDecoder) map[string][]byte {
	t.Helper()
	f, err := decode.ParseField(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := sl.Open(ctx, sl.Config{URLs: shards, Fields: []decode.Field{f}, ImageDecoder: dec, BatchSize: 8, NoIndexStore: true, CountFirst: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out := map[string][]byte{}
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		col, _ := b.Column(f.ColumnName())
		for i, k := range b.Keys() {
			out[k] = append([]byte(nil), col.Row(b.Data(), i)...)
		}
	}
	return out
}

// agreement compares images with their references: the worst key's mean absolute
// difference, the largest pixel difference, and how many keys are identical.
func agreement(t *testing.T, got, refs map[string][]byte) (worstMean float64, maxDiff, exact int) {
	t.Helper()
	if len(got) != len(refs) || len(refs) == 0 {
		t.Fatalf("%d images for %d references", len(got), len(refs))
	}
	for k, ref := range refs {
		g, ok := got[k]
		if !ok || len(g) != len(ref) {
			t.Fatalf("%s: no image of %d bytes", k, len(ref))
		}
		var sum, mx int
		for i := range g {
			d := int(g[i]) - int(ref[i])
			if d < 0 {
				d = -d
			}
			sum += d
			mx = max(mx, d)
		}
		worstMean = max(worstMean, float64(sum)/float64(len(g)))
		maxDiff = max(maxDiff, mx)
		if mx == 0 {
			exact++
		}
	}
	return worstMean, maxDiff, exact
}

// TestImagesAgreeWithPIL: resize + center crop of real-sized photos, of photos four
// times larger (which libjpeg-turbo decodes at a reduced scale), and of the real
// tarproc PNGs, against PIL, with each JPEG decoder: every key's mean absolute
// difference under 2 levels, every pixel within the bound stated in the README.
func TestImagesAgreeWithPIL(t *testing.T) {
	py := pythonPIL(t)
	decoders := []decode.ImageDecoder{decode.ImageDecoderTurbo, decode.ImageDecoderGo}
	if _, err := decode.ImageDecoderTurbo.Resolve(); err != nil {
		if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
			t.Fatal(err)
		}
		t.Logf("SKIPPED libjpeg-turbo: %v", err)
		decoders = decoders[1:]
	}
	photos := photoShards(t, py, t.TempDir(), 2, 12, "--seed", "3")
	large := photoShards(t, py, t.TempDir(), 1, 6, "--seed", "4", "--width", "2000", "--height", "1500", "--detail", "30")
	tarproc, _ := filepath.Abs("../testdata/tarproc__sample.tar")
	cases := []struct {
		name   string
		shards []string
		ext    string
		resize int
		// The bounds: a key's mean absolute difference, and a pixel's.
		turboMean, goMean float64
		turboMax, goMax   int
	}{
		// libjpeg-turbo decodes as PIL does (PIL is built on it), so at full scale the
		// pixels are PIL's; Go's image/jpeg has another IDCT (shardload upsamples its
		// chroma and converts it to RGB as libjpeg does): measured mean 0.04, max 3.
		{"photos", photos, "jpg", 0, 0.01, 0.5, 1, 8},
		{"photos-resize256", photos, "jpg", 256, 0.01, 0.5, 1, 8},
		// Decoded at 1/2 scale in the DCT, then resized: not PIL's pixels, but within a
		// level of its antialiased downscale of the full image (measured: mean 0.46,
		// max 5).
		{"large", large, "jpg", 0, 2, 0.5, 12, 8},
		{"tarproc-png", []string{tarproc}, "png", 0, 0.01, 0.01, 1, 1},
	}
	for _, c := range cases {
		refs := references(t, py, c.ext, c.resize, c.shards)
		spec := "img=" + c.ext + ":image:uint8:224x224x3"
		if c.resize > 0 {
			spec += ":resize=" + itoa(int64(c.resize))
		}
		for _, dec := range decoders {
			mean, mx, exact := agreement(t, loaderImages(t, c.shards, spec, dec), refs)
			t.Logf("%s, %s: worst key's mean absolute difference %.3f, max %d, %d of %d keys identical", c.name, dec, mean, mx, exact, len(refs))
			wantMean, wantMax := c.goMean, c.goMax
			if dec == decode.ImageDecoderTurbo {
				wantMean, wantMax = c.turboMean, c.turboMax
			}
			if mean >= wantMean || mx > wantMax {
				t.Errorf("%s, %s: worst mean %.3f (bound %.2f), max %d (bound %d)", c.name, dec, mean, wantMean, mx, wantMax)
			}
		}
	}
}

// TestServeImages: a Python trainer reading through serve, from S3, receives uint8
// image tensors of the spec's shape whose pixels are PIL's, and labels.
func TestServeImages(t *testing.T) {
	py := pythonPIL(t)
	paths := photoShards(t, py, t.TempDir(), 3, 10, "--seed", "5")
	m := testutil.MinIO(t)
	m.CreateBucket(t, "img")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m.Put(t, "img", "train/"+filepath.Base(p), data)
	}
	pattern := "s3://img/train/images-{000000..000002}.tar"
	// Counted first: estimated counts would pad or trim the epoch to its plan.
	srv := startServerEnv(t, m.Env(), "", "--workers", "2", "--count-first", pattern)
	// The server decodes as this process would: with libjpeg-turbo, PIL's pixels.
	bounds := []string{"--max-diff", "1", "--max-mean-diff", "0.01"}
	if d, _ := decode.ImageDecoderAuto.Resolve(); d == decode.ImageDecoderGo {
		bounds = []string{"--max-diff", "8", "--max-mean-diff", "0.5"}
	}
	for _, spec := range []string{"img=jpg:image:uint8:224x224x3", "img=jpg:image:uint8:3x224x224:resize=256"} {
		args := append([]string{imageCheck, "--socket", srv.socket, "--field-spec", spec, "--field-spec", "label=cls", "--check-keys", "0"}, bounds...)
		out := runPy(t, py, append(append(args, "--shards"), paths...)...)
		var res struct {
			Samples, Batches int
			KeysChecked      int     `json:"keys_checked"`
			MeanAbsDiff      float64 `json:"mean_abs_diff"`
			MaxAbsDiff       int     `json:"max_abs_diff"`
			Layout           string
			Problems         []string
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("image_check.py printed %q: %v", out, err)
		}
		t.Logf("%s: %+v", spec, res)
		if res.Samples != 30 || res.KeysChecked != 30 || len(res.Problems) > 0 {
			t.Errorf("%s: %+v", spec, res)
		}
	}
}
