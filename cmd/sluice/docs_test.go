package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // the router filter's type, for typed_config
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/apidoc"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// docFiles are the Markdown files the docs tests read: README.md and
// docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(repoRoot, "README.md"))
	if len(files) < 2 {
		t.Fatalf("no docs found under %s/docs", repoRoot)
	}
	return files
}

// fence is one fenced code block of a Markdown file.
type fence struct {
	info string // the info string: "yaml", "sh", ...
	line int    // the line of the block's first content line
	body string
}

// markdown is a Markdown file split into its fenced blocks and the lines
// outside them (blank where a fence was, so line numbers stay right).
type markdown struct {
	fences []fence
	prose  []string
}

func parseMarkdown(src string) markdown {
	var md markdown
	var cur *fence
	var marker string
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if m := fenceOpen.FindStringSubmatch(trimmed); m != nil {
				marker = m[1]
				var info string
				if f := strings.Fields(m[2]); len(f) > 0 {
					info = f[0]
				}
				cur = &fence{info: info, line: n + 1}
				md.prose = append(md.prose, "")
				continue
			}
			md.prose = append(md.prose, line)
			continue
		}
		md.prose = append(md.prose, "")
		if strings.HasPrefix(trimmed, marker) && strings.TrimLeft(trimmed, marker[:1]) == "" {
			md.fences = append(md.fences, *cur)
			cur = nil
			continue
		}
		cur.body += line + "\n"
	}
	return md
}

var fenceOpen = regexp.MustCompile("^(```+|~~~+)\\s*(.*)$")

// domainBlocks returns the yaml blocks whose top level is a mapping with a
// domain key: the rule files the docs show.
func domainBlocks(md markdown) []fence {
	var out []fence
	for _, f := range md.fences {
		if f.info != "yaml" && f.info != "yml" {
			continue
		}
		var top map[string]any
		if err := yaml.Unmarshal([]byte(f.body), &top); err != nil {
			continue // not a mapping (or not YAML at all): not a domain file
		}
		if _, ok := top["domain"]; ok {
			out = append(out, f)
		}
	}
	return out
}

// checkBlock runs `sluice rules check` on one block, written to dir under a
// name that says where it came from, and returns what the checker printed
// when it refused the block.
func checkBlock(t *testing.T, dir, doc string, b fence) (ok bool, output string) {
	t.Helper()
	name := filepath.Join(dir, fmt.Sprintf("%s-line%d.yaml", strings.TrimSuffix(filepath.Base(doc), ".md"), b.line))
	if err := os.WriteFile(name, []byte(b.body), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "rules", "check", name)
	return code == 0, stdout + stderr
}

// TestDocsRuleExamplesPass runs the real `sluice rules check` on every yaml
// block of the docs with a top-level domain key: an example a reader copies
// must load.
func TestDocsRuleExamplesPass(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	checked := 0
	for _, doc := range docFiles(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range domainBlocks(parseMarkdown(string(src))) {
			checked++
			if ok, out := checkBlock(t, dir, doc, b); !ok {
				t.Errorf("%s:%d: the rules example is refused by sluice rules check:\n%s", doc, b.line, out)
			}
		}
	}
	// The docs show a dozen rule files; finding none means the extraction
	// broke, not that there is nothing to check.
	if checked < 8 {
		t.Errorf("checked %d rule examples in the docs, want at least 8", checked)
	}
}

// TestDocsCheckerRefusesBadExamples shows the check above can fail: a broken
// rule example in a Markdown file is found and refused, and blocks that are
// not domain files are left alone.
func TestDocsCheckerRefusesBadExamples(t *testing.T) {
	t.Parallel()
	md := parseMarkdown("# T\n\n```yaml\ndomain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n```\n\n" +
		"```yaml\nkind: Deployment\n```\n\n```sh\ndomain: not yaml here\n```\n\n   ```yaml\n   domain: ok\n   ```\n")
	blocks := domainBlocks(md)
	if len(blocks) != 2 {
		t.Fatalf("found %d domain blocks, want 2: %+v", len(blocks), blocks)
	}
	if blocks[0].line != 4 {
		t.Errorf("first block starts on line %d, want 4", blocks[0].line)
	}
	ok, out := checkBlock(t, t.TempDir(), "x.md", blocks[0])
	if ok || !strings.Contains(out, "x-line4.yaml:4:") || !strings.Contains(out, "fortnight") {
		t.Errorf("bad block: ok=%v, output %q; want refused at x-line4.yaml:4", ok, out)
	}
}

// anchors returns the anchors of a Markdown file: its headings' slugs (a
// repeated heading gets -1, -2, ...) and explicit <a id|name="..."> tags.
func anchors(md markdown) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range md.prose {
		if m := headingRE.FindStringSubmatch(line); m != nil {
			s := apidoc.Slug(strings.TrimRight(m[1], " #"))
			if n := seen[s]; n > 0 {
				out[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				out[s] = true
			}
			seen[s]++
		}
		for _, m := range anchorTagRE.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
	}
	return out
}

var (
	headingRE   = regexp.MustCompile(`^#{1,6}\s+(.+)$`)
	anchorTagRE = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	// linkRE finds inline links and images: [text](target "title").
	linkRE     = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
)

// deadLinks returns the relative links of a Markdown file that lead nowhere:
// a missing file, or an anchor its target file does not have.
func deadLinks(t *testing.T, doc string, md markdown, load func(string) (markdown, error)) []string {
	t.Helper()
	var dead []string
	for i, line := range md.prose {
		line = codeSpanRE.ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := doc
			if path != "" {
				file = filepath.Join(filepath.Dir(doc), filepath.FromSlash(path))
				if _, err := os.Stat(file); err != nil {
					dead = append(dead, fmt.Sprintf("%s:%d: %s: no such file", doc, i+1, target))
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				dead = append(dead, fmt.Sprintf("%s:%d: %s: an anchor in a file that is not Markdown", doc, i+1, target))
				continue
			}
			tm, err := load(file)
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(tm)[anchor] {
				dead = append(dead, fmt.Sprintf("%s:%d: %s: %s has no heading or anchor #%s", doc, i+1, target, file, anchor))
			}
		}
	}
	return dead
}

func loadMarkdown(path string) (markdown, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return markdown{}, err
	}
	return parseMarkdown(string(src)), nil
}

// TestDocsLinks fails on a relative link or anchor in README.md or
// docs/*.md that leads nowhere.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	// docs/api.md links to its own headings a hundred times: parse each file once.
	cache := map[string]markdown{}
	load := func(path string) (markdown, error) {
		if md, ok := cache[path]; ok {
			return md, nil
		}
		md, err := loadMarkdown(path)
		cache[path] = md
		return md, err
	}
	links := 0
	for _, doc := range docFiles(t) {
		md, err := load(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range md.prose {
			links += len(linkRE.FindAllString(codeSpanRE.ReplaceAllString(line, ""), -1))
		}
		for _, d := range deadLinks(t, doc, md, load) {
			t.Error(d)
		}
	}
	if links < 20 {
		t.Errorf("found %d links in the docs, want at least 20: is the link pattern broken?", links)
	}
}

// TestDeadLinksFound shows the link check can fail.
func TestDeadLinksFound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	other := filepath.Join(dir, "other.md")
	if err := os.WriteFile(other, []byte("# Other\n\n## Two words\n\n## Two words\n\n<a id=\"x\"></a>\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(dir, "doc.md")
	src := "# Doc\n\n## Here\n\n" +
		"[ok](other.md) [ok](other.md#two-words) [ok](other.md#two-words-1) [ok](other.md#x) [ok](#here) [ok](https://example.com/nope)\n" +
		"[dead](missing.md) [dead](other.md#nope) [dead](#nowhere) ![dead](img.png)\n" +
		"`[not a link](missing.md)`\n\n```md\n[in a block](missing.md)\n```\n"
	if err := os.WriteFile(doc, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	got := deadLinks(t, doc, parseMarkdown(src), loadMarkdown)
	var targets []string
	for _, d := range got {
		f := strings.SplitN(d, ": ", 3)
		targets = append(targets, f[1])
	}
	want := []string{"missing.md", "other.md#nope", "#nowhere", "img.png"}
	if !slices.Equal(targets, want) {
		t.Errorf("dead links %q, want %q (all: %q)", targets, want, got)
	}
}

// metricNameRE finds the names the code registers with client_golang.
var metricNameRE = regexp.MustCompile(`Name:\s*"(sluice_[a-z0-9_]+)"`)

// codeMetrics returns every metric name registered by the non-test Go
// files of enforcer/ and backend/.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, dir := range []string{"enforcer", "backend"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range metricNameRE.FindAllSubmatch(src, -1) {
				out[string(m[1])] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(out) < 10 {
		t.Fatalf("found %d metrics in the code, want at least 10: is the pattern broken?", len(out))
	}
	return out
}

// TestDocsMetricNames keeps the metric names of the docs real: every
// sluice_* metric the docs name (alert rules included) is registered by the
// code, and docs/operating.md lists every metric the code registers.
func TestDocsMetricNames(t *testing.T) {
	t.Parallel()
	code := codeMetrics(t)
	nameRE := regexp.MustCompile(`\bsluice_(?:enforcer|console)_[a-z0-9_]+`)
	for _, doc := range docFiles(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range bytes.Split(src, []byte("\n")) {
			for _, m := range nameRE.FindAll(line, -1) {
				name := string(m)
				base := name
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					base = strings.TrimSuffix(base, suffix)
				}
				if !code[name] && !code[base] {
					t.Errorf("%s:%d: metric %s is not registered by the code", doc, n+1, name)
				}
			}
		}
	}
	ops, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range code {
		if !regexp.MustCompile(`\b` + name + `\b`).Match(ops) {
			t.Errorf("docs/operating.md does not list the metric %s", name)
		}
	}
}

// TestEnvoyConfigDecodes decodes docs/envoy.yaml as Envoy's v3 bootstrap with
// the protobuf types Envoy itself is generated from: an unknown field, a
// wrong type or a typed_config of an unknown type fails, as it would fail
// Envoy's start; then it runs the field validations Envoy runs (the
// protoc-gen-validate rules) on the bootstrap and every typed_config in it,
// and checks that the ratelimit filter's domain is one the docs define and
// that it calls the enforcer's gRPC port.
func TestEnvoyConfigDecodes(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join(repoRoot, "docs", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	boot, err := decodeEnvoyBootstrap(src)
	if err != nil {
		t.Fatalf("docs/envoy.yaml: %v", err)
	}
	rl, hcm := envoyRateLimitFilter(t, boot)
	if rl.GetRateLimitService().GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("rate_limit_service transport_api_version = %v, want V3", rl.GetRateLimitService().GetTransportApiVersion())
	}
	cluster := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	var port uint32
	for _, c := range boot.GetStaticResources().GetClusters() {
		if c.GetName() != cluster {
			continue
		}
		for _, e := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range e.GetLbEndpoints() {
				port = lb.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
			}
		}
		opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if !ok {
			t.Errorf("cluster %s: no HttpProtocolOptions: gRPC needs HTTP/2", cluster)
		} else {
			var po upstreamhttpv3.HttpProtocolOptions
			if err := opts.UnmarshalTo(&po); err != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
				t.Errorf("cluster %s: HTTP/2 not configured (%v)", cluster, err)
			}
		}
	}
	if want := enforcerDefault(t, "grpc-listen"); fmt.Sprintf(":%d", port) != want {
		t.Errorf("cluster %q port %d, want the enforcer's gRPC port %s", cluster, port, want)
	}
	if len(hcm.GetRouteConfig().GetVirtualHosts()) == 0 {
		t.Fatal("no virtual hosts")
	}
	// The keys the routes send are keys of the domain docs/envoy.md defines.
	md, err := loadMarkdown(filepath.Join(repoRoot, "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	var domainYAML string
	for _, b := range domainBlocks(md) {
		if strings.Contains(b.body, "domain: "+rl.GetDomain()+"\n") {
			domainYAML = b.body
		}
	}
	if domainYAML == "" {
		t.Fatalf("docs/envoy.md has no rules example for domain %q", rl.GetDomain())
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			for _, lim := range r.GetRoute().GetRateLimits() {
				for _, a := range lim.GetActions() {
					key := "remote_address"
					switch {
					case a.GetRequestHeaders() != nil:
						key = a.GetRequestHeaders().GetDescriptorKey()
					case a.GetGenericKey() != nil:
						key = a.GetGenericKey().GetDescriptorKey()
					}
					if !strings.Contains(domainYAML, "key: "+key+"\n") {
						t.Errorf("route %s sends key %q, which the domain %q in docs/envoy.md does not have", r.GetMatch().GetPrefix(), key, rl.GetDomain())
					}
				}
			}
		}
	}
}

// TestEnvoyConfigCheckCanFail shows the decoding is strict.
func TestEnvoyConfigCheckCanFail(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join(repoRoot, "docs", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string][2]string{
		"unknown field":        {"failure_mode_deny: false", "failure_mode_denied: false"},
		"unknown typed_config": {"ratelimit.v3.RateLimit", "ratelimit.v3.RateLimitz"},
		"invalid value":        {"port_value: 8082", "port_value: 80820"},
		"validation rule":      {"cluster_name: sluice}", "cluster_name: \"\"}"},
	} {
		bad := strings.ReplaceAll(string(src), edit[0], edit[1])
		if bad == string(src) {
			t.Fatalf("%s: %q not in docs/envoy.yaml", name, edit[0])
		}
		if _, err := decodeEnvoyBootstrap([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// decodeEnvoyBootstrap decodes an Envoy YAML config strictly and validates
// it and the typed_configs of its listeners' filters.
func decodeEnvoyBootstrap(src []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := sigsyaml.YAMLToJSON(src)
	if err != nil {
		return nil, err
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		return nil, err
	}
	if err := boot.ValidateAll(); err != nil {
		return nil, err
	}
	type validator interface{ ValidateAll() error }
	check := func(a *anypb.Any) (proto.Message, error) {
		m, err := a.UnmarshalNew()
		if err != nil {
			return nil, err
		}
		v, ok := m.(validator)
		if !ok {
			return nil, fmt.Errorf("%s has no validation", a.GetTypeUrl())
		}
		return m, v.ValidateAll()
	}
	for _, l := range boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				m, err := check(f.GetTypedConfig())
				if err != nil {
					return nil, fmt.Errorf("filter %s: %w", f.GetName(), err)
				}
				hcm, ok := m.(*hcmv3.HttpConnectionManager)
				if !ok {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					if _, err := check(hf.GetTypedConfig()); err != nil {
						return nil, fmt.Errorf("http filter %s: %w", hf.GetName(), err)
					}
				}
			}
		}
	}
	for _, c := range boot.GetStaticResources().GetClusters() {
		for name, a := range c.GetTypedExtensionProtocolOptions() {
			if _, err := check(a); err != nil {
				return nil, fmt.Errorf("cluster %s %s: %w", c.GetName(), name, err)
			}
		}
	}
	return &boot, nil
}

// envoyRateLimitFilter returns the ratelimit filter's config and the HTTP
// connection manager holding it.
func envoyRateLimitFilter(t *testing.T, boot *bootstrapv3.Bootstrap) (*ratelimitv3.RateLimit, *hcmv3.HttpConnectionManager) {
	t.Helper()
	for _, l := range boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var rl ratelimitv3.RateLimit
					if hf.GetName() == "envoy.filters.http.ratelimit" && hf.GetTypedConfig().UnmarshalTo(&rl) == nil {
						return &rl, &hcm
					}
				}
			}
		}
	}
	t.Fatal("no envoy.filters.http.ratelimit filter in docs/envoy.yaml")
	return nil, nil
}
