package main

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluicehq/sluice/backend/store"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"
)

// flagInfo is one flag of a subcommand, as its -h lists it.
type flagInfo struct {
	name, env, def string
}

var (
	flagLineRE    = regexp.MustCompile(`^  -([A-Za-z0-9-]+)`)
	flagEnvRE     = regexp.MustCompile(`\(env ([A-Z0-9_]+)\)`)
	flagDefaultRE = regexp.MustCompile(`\(default "?([^")]*)"?\)`)
)

// binaryFlags returns the flags of `sluice CMD` by running `sluice CMD -h`
// through run: the binary's own flag set, each with its environment
// variable and default.
func binaryFlags(t *testing.T, cmd string) map[string]flagInfo {
	t.Helper()
	code, stdout, stderr := runCLI(t, cmd, "-h")
	if code != 0 {
		t.Fatalf("sluice %s -h: exit %d: %s", cmd, code, stderr)
	}
	out := map[string]flagInfo{}
	var cur *flagInfo
	flush := func() {
		if cur != nil {
			out[cur.name] = *cur
		}
	}
	for _, line := range strings.Split(stdout+stderr, "\n") {
		if m := flagLineRE.FindStringSubmatch(line); m != nil {
			flush()
			cur = &flagInfo{name: m[1]}
			line = line[len(m[0]):]
		}
		if cur == nil {
			continue
		}
		if m := flagEnvRE.FindStringSubmatch(line); m != nil {
			cur.env = m[1]
		}
		if m := flagDefaultRE.FindStringSubmatch(line); m != nil {
			cur.def = m[1]
		}
	}
	flush()
	if len(out) == 0 || out["database-url"].name == "" && out["listen"].name == "" {
		t.Fatalf("sluice %s -h listed %d flags: is its format still flag.PrintDefaults'?", cmd, len(out))
	}
	return out
}

// enforcerDefault is the default of one of the enforcer's flags.
func enforcerDefault(t *testing.T, name string) string {
	t.Helper()
	f, ok := binaryFlags(t, "enforcer")[name]
	if !ok {
		t.Fatalf("sluice enforcer has no flag --%s", name)
	}
	return f.def
}

// manifest is one decoded Kubernetes object and where it came from.
type manifest struct {
	file string
	obj  any
}

// decodeManifests decodes every document of every YAML file under dir
// strictly into its k8s.io/api type: an unknown field, a field of the wrong
// type, or a kind this test does not know fails.
func decodeManifests(t *testing.T, dir string) []manifest {
	t.Helper()
	var out []manifest
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != dir && d.Name() == "options" {
			return filepath.SkipDir // alternatives to base files, checked in their place
		}
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || d.Name() == "kustomization.yaml" {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range splitYAMLDocuments(src) {
			obj, err := decodeManifest(doc)
			if err != nil {
				t.Errorf("%s: document %d: %v", path, i+1, err)
				continue
			}
			out = append(out, manifest{path, obj})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// splitYAMLDocuments splits a multi-document YAML file on its "---" lines,
// leaving out documents with nothing but comments.
func splitYAMLDocuments(src []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(src), -1) {
		blank := true
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				blank = false
			}
		}
		if !blank {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// manifestKinds are the kinds the base may hold, by apiVersion and kind.
var manifestKinds = map[string]func() any{
	"v1/Namespace":                           func() any { return &corev1.Namespace{} },
	"v1/Secret":                              func() any { return &corev1.Secret{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                    func() any { return &appsv1.StatefulSet{} },
	"policy/v1/PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return &networkingv1.NetworkPolicy{} },
	"batch/v1/Job":                           func() any { return &batchv1.Job{} },
}

func decodeManifest(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	mk, ok := manifestKinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q kind %q: not a kind this test knows", tm.APIVersion, tm.Kind)
	}
	obj := mk()
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// kustomization is the part of kustomize's Kustomization the base uses,
// decoded strictly too.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
	} `json:"labels"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

const kubeDir = repoRoot + "/deploy/kubernetes"

// TestKubernetesManifests decodes the kustomize base strictly with the
// k8s.io/api types and checks it against the binary: every --flag and
// SLUICE_* variable a container sets is one its subcommand has, container
// ports are the ports the binary listens on, probes ask /healthz or /readyz
// on the HTTP port, and Services, PodDisruptionBudgets, the autoscaler and
// NetworkPolicies point at pods and ports that exist.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join(kubeDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := sigsyaml.UnmarshalStrict(src, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml is %s %s", k.APIVersion, k.Kind)
	}
	// Every top-level manifest is a resource of the base, and every resource exists.
	files, _ := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	var top []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			top = append(top, b)
		}
	}
	res := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(res, top) {
		t.Errorf("kustomization resources %q, want the files beside it %q", res, top)
	}

	ms := decodeManifests(t, kubeDir)
	if len(ms) < 10 {
		t.Fatalf("decoded %d manifests, want at least 10", len(ms))
	}
	checkWorkloads(t, ms)
	// options/enforcer-statefulset.yaml in place of enforcer.yaml.
	var withStatefulSet []manifest
	for _, m := range ms {
		if filepath.Base(m.file) != "enforcer.yaml" {
			withStatefulSet = append(withStatefulSet, m)
		}
	}
	option := decodeManifests(t, filepath.Join(kubeDir, "options", "enforcer-statefulset.yaml"))
	if len(option) == 0 {
		t.Fatal("options/enforcer-statefulset.yaml: no manifests")
	}
	t.Run("statefulset", func(t *testing.T) { checkWorkloads(t, append(withStatefulSet, option...)) })
}

// envVar returns the variable name of container c, or nil.
func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// checkWorkloads checks one set of manifests that make up the base: the
// console and enforcer workloads and what points at them.
func checkWorkloads(t *testing.T, ms []manifest) {
	t.Helper()
	uid := dockerfileUser(t)
	var pods []podOf
	secrets := map[string]*corev1.Secret{}
	var hpas []*autoscalingv2.HorizontalPodAutoscaler
	for _, m := range ms {
		switch o := m.obj.(type) {
		case *appsv1.Deployment:
			pods = append(pods, podOf{m.file, o.Kind, o.Name, o.Spec.Selector, &o.Spec.Template, o.Spec.Replicas})
		case *appsv1.StatefulSet:
			pods = append(pods, podOf{m.file, o.Kind, o.Name, o.Spec.Selector, &o.Spec.Template, o.Spec.Replicas})
		case *batchv1.Job:
			pods = append(pods, podOf{m.file, o.Kind, o.Name, nil, &o.Spec.Template, nil})
		case *corev1.Secret:
			secrets[o.Name] = o
		case *autoscalingv2.HorizontalPodAutoscaler:
			hpas = append(hpas, o)
		}
	}
	byComponent := map[string]podOf{}
	for _, p := range pods {
		checkPod(t, p, uid, secrets)
		byComponent[p.tmpl.Labels["app.kubernetes.io/component"]] = p
	}
	console, enforcer := byComponent["console"], byComponent["enforcer"]
	if console.tmpl == nil || enforcer.tmpl == nil {
		t.Fatalf("want a console and an enforcer workload, have %v", slices.Collect(maps.Keys(byComponent)))
	}
	if console.kind != "Deployment" || console.replicas == nil || *console.replicas != 2 {
		t.Errorf("console: %s with %v replicas, want a Deployment with 2", console.kind, console.replicas)
	}

	covered := map[string][]string{} // workload name → kinds pointing at it
	for _, m := range ms {
		switch o := m.obj.(type) {
		case *corev1.Service:
			p := selects(t, m.file, "Service "+o.Name, &metav1.LabelSelector{MatchLabels: o.Spec.Selector}, pods)
			covered[p.name] = append(covered[p.name], "Service")
			for _, sp := range o.Spec.Ports {
				if _, ok := containerPort(p.tmpl, sp.TargetPort); !ok {
					t.Errorf("%s: Service %s port %s: target %s is no container port of %s", m.file, o.Name, sp.Name, sp.TargetPort.String(), p.name)
				}
			}
		case *policyv1.PodDisruptionBudget:
			p := selects(t, m.file, "PodDisruptionBudget "+o.Name, o.Spec.Selector, pods)
			covered[p.name] = append(covered[p.name], "PodDisruptionBudget")
		case *networkingv1.NetworkPolicy:
			p := selects(t, m.file, "NetworkPolicy "+o.Name, &o.Spec.PodSelector, pods)
			covered[p.name] = append(covered[p.name], "NetworkPolicy")
			for _, in := range o.Spec.Ingress {
				for _, np := range in.Ports {
					if _, ok := containerPort(p.tmpl, *np.Port); !ok {
						t.Errorf("%s: NetworkPolicy %s ingress port %s is no container port of %s", m.file, o.Name, np.Port.String(), p.name)
					}
				}
			}
			for _, eg := range o.Spec.Egress {
				for _, to := range eg.To {
					if to.PodSelector == nil || to.NamespaceSelector != nil {
						continue
					}
					// Egress to our own pods must name ports they have.
					if dst, ok := selectsAny(to.PodSelector, pods); ok {
						for _, np := range eg.Ports {
							if _, ok := containerPort(dst.tmpl, *np.Port); !ok {
								t.Errorf("%s: NetworkPolicy %s egress port %s is no container port of %s", m.file, o.Name, np.Port.String(), dst.name)
							}
						}
					}
				}
			}
		}
	}
	// Every enforcer pod connects as its own pod name.
	ec := enforcer.tmpl.Spec.Containers[0]
	if pod, id := envVar(ec, "POD_NAME"), envVar(ec, "SLUICE_NODE_ID"); pod == nil || pod.ValueFrom == nil || pod.ValueFrom.FieldRef == nil ||
		pod.ValueFrom.FieldRef.FieldPath != "metadata.name" || id == nil || id.Value != "$(POD_NAME)" {
		t.Errorf("%s: the node id is not the pod name (SLUICE_NODE_ID=$(POD_NAME), POD_NAME from metadata.name)", enforcer.name)
	}
	for _, h := range hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != enforcer.kind || ref.Name != enforcer.name || ref.APIVersion != "apps/v1" {
			t.Errorf("HorizontalPodAutoscaler %s scales %s %s %s, want apps/v1 %s %s", h.Name, ref.APIVersion, ref.Kind, ref.Name, enforcer.kind, enforcer.name)
		}
		switch enforcer.kind {
		case "StatefulSet":
			// Each enforcer pod needs a node token of its own, named by its pod name.
			tokens := secrets["sluice-node-tokens"]
			if tokens == nil {
				t.Fatal("no sluice-node-tokens Secret")
			}
			for i := range int(h.Spec.MaxReplicas) {
				if _, ok := tokens.StringData[fmt.Sprintf("%s-%d", enforcer.name, i)]; !ok {
					t.Errorf("HorizontalPodAutoscaler %s may scale to %d pods, but sluice-node-tokens has no token for %s-%d", h.Name, h.Spec.MaxReplicas, enforcer.name, i)
				}
			}
		case "Deployment":
			checkFleetToken(t, enforcer, console, secrets)
		default:
			t.Errorf("the enforcers are a %s, want a Deployment or a StatefulSet", enforcer.kind)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 {
			t.Errorf("HorizontalPodAutoscaler %s: minReplicas %v, want at least 2", h.Name, h.Spec.MinReplicas)
		}
		for _, c := range enforcer.tmpl.Spec.Containers {
			if c.Resources.Requests.Cpu().IsZero() {
				t.Errorf("%s: container %s has no CPU request, which the autoscaler's utilization needs", enforcer.name, c.Name)
			}
		}
		covered[enforcer.name] = append(covered[enforcer.name], "HorizontalPodAutoscaler")
	}
	want := map[string][]string{
		console.name:  {"NetworkPolicy", "PodDisruptionBudget", "Service"},
		enforcer.name: {"HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget", "Service"},
	}
	for name, kinds := range want {
		got := slices.Sorted(slices.Values(covered[name]))
		if !slices.Equal(got, kinds) {
			t.Errorf("%s has %q pointing at it, want one each of %q", name, got, kinds)
		}
	}
	// Envoy's cluster in the docs is the enforcers' Service and gRPC port.
	envoy, err := os.ReadFile(filepath.Join(repoRoot, "docs", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if port, _ := containerPort(enforcer.tmpl, intstr.FromString("grpc")); !strings.Contains(string(envoy), fmt.Sprintf("{address: %s, port_value: %d}", enforcer.name, port)) {
		t.Errorf("docs/envoy.yaml does not point at %s:%d", enforcer.name, port)
	}
}

// checkFleetToken checks a Deployment of enforcers on one fleet node
// token: every pod reads it from a file of a mounted Secret that the
// examples have, and the console makes the token from the same Secret key
// on its first start, so no token is made by hand.
func checkFleetToken(t *testing.T, enforcer, console podOf, secrets map[string]*corev1.Secret) {
	t.Helper()
	c := enforcer.tmpl.Spec.Containers[0]
	file := envVar(c, "SLUICE_NODE_TOKEN_FILE")
	if file == nil {
		t.Fatalf("%s: no SLUICE_NODE_TOKEN_FILE", enforcer.name)
	}
	var secretName, key string
	for _, vm := range c.VolumeMounts {
		for _, v := range enforcer.tmpl.Spec.Volumes {
			if v.Name == vm.Name && v.Secret != nil && filepath.Dir(file.Value) == vm.MountPath {
				secretName, key = v.Secret.SecretName, filepath.Base(file.Value)
			}
		}
	}
	s := secrets[secretName]
	if s == nil {
		t.Fatalf("%s: SLUICE_NODE_TOKEN_FILE %s is no file of a mounted Secret the examples have", enforcer.name, file.Value)
	}
	if tok, ok := s.StringData[key]; !ok || len(tok) < store.MinGivenSecret {
		t.Errorf("Secret %s has no key %s of at least %d characters (the console refuses a shorter bootstrap token)", secretName, key, store.MinGivenSecret)
	}
	boot := envVar(console.tmpl.Spec.Containers[0], "SLUICE_BOOTSTRAP_NODE_TOKEN")
	if boot == nil || boot.ValueFrom == nil || boot.ValueFrom.SecretKeyRef == nil ||
		boot.ValueFrom.SecretKeyRef.Name != secretName || boot.ValueFrom.SecretKeyRef.Key != key {
		t.Errorf("%s: SLUICE_BOOTSTRAP_NODE_TOKEN does not read Secret %s key %s, so the enforcers' token would be made by hand", console.name, secretName, key)
	}
}

// podOf is a workload's pod template.
type podOf struct {
	file, kind, name string
	selector         *metav1.LabelSelector
	tmpl             *corev1.PodTemplateSpec
	replicas         *int32
}

// selects returns the one workload whose pods sel selects.
func selects(t *testing.T, file, what string, sel *metav1.LabelSelector, pods []podOf) podOf {
	t.Helper()
	p, ok := selectsAny(sel, pods)
	if !ok {
		t.Fatalf("%s: %s selects no workload's pods (or several)", file, what)
	}
	return p
}

func selectsAny(sel *metav1.LabelSelector, pods []podOf) (podOf, bool) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return podOf{}, false
	}
	var found []podOf
	for _, p := range pods {
		if p.selector != nil && s.Matches(labels.Set(p.tmpl.Labels)) {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		return podOf{}, false
	}
	return found[0], true
}

// containerPort finds a port of a pod's containers by name or number.
func containerPort(tmpl *corev1.PodTemplateSpec, port intstr.IntOrString) (int32, bool) {
	for _, c := range tmpl.Spec.Containers {
		for _, p := range c.Ports {
			if port.Type == intstr.String && p.Name == port.StrVal || port.Type == intstr.Int && p.ContainerPort == port.IntVal {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// checkPod checks one pod template against the binary and the rules every
// Sluice pod keeps: non-root as the image's user, a read-only root file
// system, resources, and flags, variables, ports and probes the binary has.
func checkPod(t *testing.T, p podOf, uid int64, secrets map[string]*corev1.Secret) {
	t.Helper()
	where := fmt.Sprintf("%s: %s %s", p.file, p.kind, p.name)
	if p.selector != nil {
		s, err := metav1.LabelSelectorAsSelector(p.selector)
		if err != nil || !s.Matches(labels.Set(p.tmpl.Labels)) {
			t.Errorf("%s: its selector does not select its own pods", where)
		}
	}
	psc := p.tmpl.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != uid {
		t.Errorf("%s: pod securityContext must set runAsNonRoot and runAsUser %d (the Dockerfile's USER)", where, uid)
	}
	// Secret files are owned by root: a non-root process reads them through
	// the pod's fsGroup, so the group needs read permission.
	for _, v := range p.tmpl.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		mode := int32(0o644)
		if v.Secret.DefaultMode != nil {
			mode = *v.Secret.DefaultMode
		}
		if mode&0o040 == 0 || psc == nil || psc.FSGroup == nil {
			t.Errorf("%s: secret volume %s (mode %#o) is unreadable by uid %d: want fsGroup and a group-readable defaultMode", where, v.Name, mode, uid)
		}
	}
	for _, c := range p.tmpl.Spec.Containers {
		where := where + " container " + c.Name
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: securityContext must set readOnlyRootFilesystem, allowPrivilegeEscalation: false and drop ALL capabilities", where)
		}
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: want memory requests and limits", where)
		}
		if c.Image != "sluice" {
			t.Errorf("%s: image %q, want sluice (kustomization.yaml's images sets the real one)", where, c.Image)
		}
		if len(c.Args) == 0 {
			t.Errorf("%s: no subcommand in args", where)
			continue
		}
		cmd := c.Args[0]
		flags := binaryFlags(t, cmd)
		envs := map[string]string{} // variable → flag
		for _, f := range flags {
			if f.env != "" {
				envs[f.env] = f.name
				envs[f.env+"_FILE"] = f.name
			}
		}
		// The effective value of each flag: args over env over default.
		value := map[string]string{}
		for _, f := range flags {
			value[f.name] = f.def
		}
		for _, e := range c.Env {
			name, isOurs := envs[e.Name]
			if !isOurs {
				if strings.HasPrefix(e.Name, "SLUICE_") || e.Name == "DATABASE_URL" || e.Name == "REDIS_URL" {
					t.Errorf("%s: env %s is no variable of sluice %s", where, e.Name, cmd)
				}
				continue
			}
			if e.ValueFrom == nil {
				value[name] = e.Value
			}
			if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
				s := secrets[ref.SecretKeyRef.Name]
				if _, ok := s.StringData[ref.SecretKeyRef.Key]; s == nil || !ok {
					t.Errorf("%s: env %s reads Secret %s key %s, which the example Secrets lack", where, e.Name, ref.SecretKeyRef.Name, ref.SecretKeyRef.Key)
				}
			}
		}
		for i := 1; i < len(c.Args); i++ {
			a := c.Args[i]
			if !strings.HasPrefix(a, "-") {
				t.Errorf("%s: argument %q is not a flag", where, a)
				continue
			}
			name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if _, ok := flags[name]; !ok {
				t.Errorf("%s: sluice %s has no flag %s", where, cmd, a)
				continue
			}
			if !hasValue && i+1 < len(c.Args) && !strings.HasPrefix(c.Args[i+1], "-") {
				v = c.Args[i+1]
				i++
			}
			value[name] = v
		}
		// Ports are the ports the binary listens on.
		listens := map[string]string{"http": "listen", "grpc": "grpc-listen"}
		for _, cp := range c.Ports {
			flag, ok := listens[cp.Name]
			if !ok {
				t.Errorf("%s: port %s: want ports named http or grpc", where, cp.Name)
				continue
			}
			if _, port, _ := strings.Cut(value[flag], ":"); port != fmt.Sprint(cp.ContainerPort) {
				t.Errorf("%s: port %s is %d, but sluice %s listens on %q (--%s)", where, cp.Name, cp.ContainerPort, cmd, value[flag], flag)
			}
		}
		for name, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			if cmd == "migrate" {
				continue
			}
			if pr == nil || pr.HTTPGet == nil {
				t.Errorf("%s: no HTTP %s probe", where, name)
				continue
			}
			want := map[string]string{"readiness": "/readyz", "liveness": "/healthz"}[name]
			if pr.HTTPGet.Path != want {
				t.Errorf("%s: %s probe asks %s, want %s", where, name, pr.HTTPGet.Path, want)
			}
			if port, ok := containerPort(p.tmpl, pr.HTTPGet.Port); !ok || !strings.HasSuffix(value["listen"], fmt.Sprintf(":%d", port)) {
				t.Errorf("%s: %s probe port %s is not the HTTP listen port %q", where, name, pr.HTTPGet.Port.String(), value["listen"])
			}
		}
	}
}

// dockerfileUser is the numeric user the image runs as.
func dockerfileUser(t *testing.T) int64 {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER\s+(\d+)(?::\d+)?\s*$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("the Dockerfile has no numeric USER: the image must run as a non-root uid")
	}
	uid, _ := strconv.ParseInt(string(m[1]), 10, 64)
	if uid == 0 {
		t.Fatal("the Dockerfile's USER is root")
	}
	return uid
}

// TestManifestDecodingIsStrict shows the decoding fails on what Kubernetes
// would refuse or silently drop.
func TestManifestDecodingIsStrict(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"unknown field":  "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n",
		"wrong type":     "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n",
		"unknown kind":   "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
		"old apiVersion": "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata: {name: x}\n",
		"duplicate key":  "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n",
	} {
		if _, err := decodeManifest([]byte(doc)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := decodeManifest([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selector: {a: b}}\n")); err != nil {
		t.Errorf("a valid Service: %v", err)
	}
}

// composeService is a service of docker-compose.yml, as far as the tests read it.
type composeService struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// composeFile is docker-compose.yml.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose composeFile
	if err := yaml.Unmarshal(src, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return compose
}

// setting is the value a service gives a flag of its subcommand, by
// command-line argument or environment variable, and whether it sets it.
func (s composeService) setting(flag, env string) (string, bool) {
	for i := 1; i+1 < len(s.Command); i++ {
		if s.Command[i] == "--"+flag {
			return s.Command[i+1], true
		}
	}
	v, ok := s.Environment[env]
	return v, ok
}

// mount returns the named volume s mounts at the directory holding path,
// and whether it mounts it read-only.
func (s composeService) mount(path string) (volume string, readOnly, ok bool) {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && filepath.Dir(path) == parts[1] {
			return parts[0], len(parts) == 3 && parts[2] == "ro", true
		}
	}
	return "", false, false
}

// TestComposeFile checks docker-compose.yml against the binary and the
// image: every service has a health check; the Sluice services' flags and
// variables exist, and their health checks ask /healthz or /readyz on the
// port the service listens on, with a tool the image has. The enforcers
// need no step by hand: the console writes the bootstrap fleet node token
// to a volume every enforcer mounts and reads it from, in a directory the
// image gives to its user, and no enforcer is given a token of its own.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	compose := loadCompose(t)
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	runtime := string(dockerfile[strings.LastIndex(string(dockerfile), "\nFROM "):])
	sluiceServices := 0
	for name, s := range compose.Services {
		for _, v := range s.Volumes {
			if vol, _, _ := strings.Cut(v, ":"); !strings.HasPrefix(vol, ".") && !strings.HasPrefix(vol, "/") {
				if _, ok := compose.Volumes[vol]; !ok {
					t.Errorf("service %s mounts volume %s, which the file does not declare", name, vol)
				}
			}
		}
		if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 {
			t.Errorf("service %s has no health check", name)
			continue
		}
		if !strings.HasPrefix(s.Image, "sluice") {
			continue
		}
		sluiceServices++
		cmd := s.Command[0]
		flags := binaryFlags(t, cmd)
		value := map[string]string{}
		envs := map[string]string{}
		for _, f := range flags {
			value[f.name] = f.def
			envs[f.env], envs[f.env+"_FILE"] = f.name, f.name
		}
		for k := range s.Environment {
			if _, ok := envs[k]; !ok {
				t.Errorf("service %s: env %s is no variable of sluice %s", name, k, cmd)
			}
		}
		for i := 1; i < len(s.Command); i++ {
			f := strings.TrimLeft(s.Command[i], "-")
			if _, ok := flags[f]; !ok {
				t.Errorf("service %s: sluice %s has no flag %s", name, cmd, s.Command[i])
				continue
			}
			if i+1 < len(s.Command) && !strings.HasPrefix(s.Command[i+1], "-") {
				value[f] = s.Command[i+1]
				i++
			}
		}
		test := s.Healthcheck.Test
		if test[0] != "CMD" {
			t.Errorf("service %s: health check %q: want the exec form (CMD ...), the image has no shell tools", name, test)
			continue
		}
		if tool := test[1]; tool != "sluice" && !regexp.MustCompile(`apt-get install[^\n]*\b`+tool+`\b`).MatchString(runtime) {
			t.Errorf("service %s: health check runs %s, which the runtime image does not install", name, tool)
		}
		_, port, _ := strings.Cut(value["listen"], ":")
		url := test[len(test)-1]
		if url != "http://127.0.0.1:"+port+"/healthz" && url != "http://127.0.0.1:"+port+"/readyz" {
			t.Errorf("service %s: health check asks %s, want /healthz or /readyz on the listen port %s", name, url, port)
		}
	}
	if sluiceServices < 2 {
		t.Errorf("found %d Sluice services in docker-compose.yml, want the console and the enforcers", sluiceServices)
	}

	// The bootstrap token: written by the console, read by every enforcer.
	console, ok := compose.Services["console"]
	if !ok {
		t.Fatal("docker-compose.yml has no console service")
	}
	tokenFile, ok := console.setting("bootstrap-node-token-file", "SLUICE_BOOTSTRAP_NODE_TOKEN_FILE")
	if !ok {
		t.Fatal("the console service sets no --bootstrap-node-token-file: the enforcers would need tokens made by hand")
	}
	vol, ro, ok := console.mount(tokenFile)
	if !ok || ro {
		t.Errorf("the console writes %s, but mounts no writable volume at %s", tokenFile, filepath.Dir(tokenFile))
	}
	uid := dockerfileUser(t)
	if !regexp.MustCompile(fmt.Sprintf(`install -d -o %d -g %d -m 07[0-7]0 %s\b`, uid, uid, regexp.QuoteMeta(filepath.Dir(tokenFile)))).MatchString(runtime) {
		t.Errorf("the runtime image does not make %s, owned by uid %d: a fresh volume mounted there would be root's, and the console could not write the token", filepath.Dir(tokenFile), uid)
	}
	ids := map[string]string{}
	enforcers := 0
	for name, s := range compose.Services {
		if !strings.HasPrefix(s.Image, "sluice") || len(s.Command) == 0 || s.Command[0] != "enforcer" {
			continue
		}
		enforcers++
		if f, _ := s.setting("node-token-file", "SLUICE_NODE_TOKEN_FILE"); f != tokenFile {
			t.Errorf("service %s reads its node token from %q, want the console's bootstrap token file %s", name, f, tokenFile)
		}
		if v, _, ok := s.mount(tokenFile); !ok || v != vol {
			t.Errorf("service %s does not mount volume %s at %s", name, vol, filepath.Dir(tokenFile))
		}
		if tok, ok := s.setting("node-token", "SLUICE_NODE_TOKEN"); ok {
			t.Errorf("service %s is given a node token (%q): the fleet token needs none by hand", name, tok)
		}
		id, _ := s.setting("node-id", "SLUICE_NODE_ID")
		if other, dup := ids[id]; dup {
			t.Errorf("services %s and %s both connect as node id %q: the second is refused while the first is connected", other, name, id)
		}
		ids[id] = name
	}
	if enforcers < 2 {
		t.Errorf("docker-compose.yml has %d enforcers, want two", enforcers)
	}
}
