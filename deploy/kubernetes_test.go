package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

const kubeDir = "kubernetes"

// grafanaDir is the one kustomization that reads files outside its directory
// (deploy/grafana's), so it needs --load-restrictor=LoadRestrictionsNone.
var grafanaDir = filepath.Join(kubeDir, "grafana")

// scheme holds the Kubernetes API types the manifests may use. A kind outside
// it (or the monitoring.coreos.com kinds below) fails the strict decode: adding
// a new kind is a deliberate act.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, policyv1.AddToScheme,
		networkingv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// The prometheus-operator's CRDs are decoded into these local types rather
// than github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring:
// that module drags in a large dependency tree (and its own pinning of
// k8s.io/*) for two small kinds. The local types hold only the fields we use,
// so a typo or an unsupported field fails the strict decode; the rule groups
// are further checked by promtool.

type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []struct {
		Record      string            `json:"record,omitempty"`
		Alert       string            `json:"alert,omitempty"`
		Expr        string            `json:"expr"`
		For         string            `json:"for,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"rules"`
}

type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// decodeStrict decodes one manifest (YAML or JSON) into its Go type. Unknown
// and duplicate fields are errors; so is a kind we do not know.
func decodeStrict(doc []byte) (any, error) {
	js, err := sigsyaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, err
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return nil, err
	}
	gvk := gv.WithKind(tm.Kind)
	var obj any
	switch gvk {
	case schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "PrometheusRule"}:
		obj = &prometheusRule{}
	case schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}:
		obj = &serviceMonitor{}
	default:
		o, err := scheme.New(gvk)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", gvk, err)
		}
		obj = o
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, fmt.Errorf("%s: %w", gvk.Kind, err)
	}
	return obj, nil
}

// kustomization is one directory with a kustomization.yaml.
type kustomization struct {
	dir       string
	component bool
	uses      []string // resources and components that are directories
}

func kustomizations(t *testing.T) []kustomization {
	t.Helper()
	var ks []kustomization
	err := filepath.WalkDir(kubeDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var k struct {
			Kind       string   `yaml:"kind"`
			Resources  []string `yaml:"resources"`
			Components []string `yaml:"components"`
		}
		if err := yaml.Unmarshal(b, &k); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		dir := filepath.Dir(path)
		kz := kustomization{dir: dir, component: k.Kind == "Component"}
		for _, r := range append(k.Resources, k.Components...) {
			p := filepath.Join(dir, r)
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				kz.uses = append(kz.uses, filepath.Clean(p))
			}
		}
		ks = append(ks, kz)
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, ks)
	return ks
}

// rendered is the output of one kustomize build, decoded.
type rendered struct {
	objs       []any
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

func (r *rendered) podTemplates() map[string]*corev1.PodTemplateSpec {
	pts := map[string]*corev1.PodTemplateSpec{}
	for _, o := range r.objs {
		switch o := o.(type) {
		case *appsv1.StatefulSet:
			pts["StatefulSet/"+o.Name] = &o.Spec.Template
		case *appsv1.Deployment:
			pts["Deployment/"+o.Name] = &o.Spec.Template
		case *appsv1.DaemonSet:
			pts["DaemonSet/"+o.Name] = &o.Spec.Template
		}
	}
	return pts
}

var (
	buildMu    sync.Mutex
	buildCache = map[string]*rendered{}
)

// build runs kustomize (krusty, as `kustomize build` does, with the default
// root-only load restrictions) on dir and decodes every resource strictly.
func build(t *testing.T, dir string) *rendered {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if r, ok := buildCache[dir]; ok {
		return r
	}
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsRootOnly
	if dir == grafanaDir {
		opts.LoadRestrictions = types.LoadRestrictionsNone // documented in its kustomization.yaml
	}
	rm, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", dir)
	r := &rendered{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, res := range rm.Resources() {
		y, err := res.AsYAML()
		require.NoError(t, err)
		obj, err := decodeStrict(y)
		require.NoError(t, err, "kustomize build %s: %s/%s", dir, res.GetKind(), res.GetName())
		r.objs = append(r.objs, obj)
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.Secret:
			r.secrets[o.Name] = o
		}
	}
	buildCache[dir] = r
	return r
}

// TestKustomizationsBuild builds every kustomization; every component must be
// built by at least one of them (a component cannot be built alone).
func TestKustomizationsBuild(t *testing.T) {
	used := map[string]bool{}
	var components []string
	for _, k := range kustomizations(t) {
		for _, u := range k.uses {
			used[u] = true
		}
		if k.component {
			components = append(components, k.dir)
			continue
		}
		t.Run(k.dir, func(t *testing.T) {
			r := build(t, k.dir)
			require.NotEmpty(t, r.objs)
		})
	}
	for _, c := range components {
		require.True(t, used[c], "component %s is not used by any kustomization, so it is never built", c)
	}
}

// TestManifestsDecodeStrictly decodes every Kubernetes object in the files
// under kubernetes/ (bases, patches, examples) into its API type; unknown
// fields fail. Built output is checked the same way by build.
func TestManifestsDecodeStrictly(t *testing.T) {
	n := 0
	err := filepath.WalkDir(kubeDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		dec := yaml.NewDecoder(f)
		for i := 0; ; i++ {
			var node yaml.Node
			if err := dec.Decode(&node); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return fmt.Errorf("%s: document %d: %w", path, i, err)
			}
			var head struct {
				APIVersion any    `yaml:"apiVersion"`
				Kind       string `yaml:"kind"`
			}
			if err := node.Decode(&head); err != nil || head.Kind == "" || head.APIVersion == nil {
				continue // a config file (receiver.yaml, Grafana provisioning, promtool test), not an object
			}
			if head.Kind == "Kustomization" || head.Kind == "Component" {
				continue // checked by krusty in TestKustomizationsBuild
			}
			doc, err := yaml.Marshal(&node)
			if err != nil {
				return err
			}
			if _, err := decodeStrict(doc); err != nil {
				return fmt.Errorf("%s: document %d: %w", path, i, err)
			}
			n++
		}
	})
	require.NoError(t, err)
	require.Greater(t, n, 15, "decoded too few manifests: is the walk broken?")

	// The check itself must refuse unknown fields and unknown kinds.
	_, err = decodeStrict([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {portz: []}\n"))
	require.ErrorContains(t, err, "portz")
	_, err = decodeStrict([]byte("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: [{name: g, rules: [{record: r, expr: up, fro: 1m}]}]}\n"))
	require.ErrorContains(t, err, "fro")
	_, err = decodeStrict([]byte("apiVersion: example.com/v1\nkind: Thing\nmetadata: {name: x}\n"))
	require.Error(t, err)
}

// TestDevAndProductionShape pins down what the overlays promise.
func TestDevAndProductionShape(t *testing.T) {
	for _, tc := range []struct {
		dir      string
		replicas int32
		bucket   string
	}{
		{filepath.Join(kubeDir, "overlays/dev"), 1, "type: filesystem"},
		{filepath.Join(kubeDir, "overlays/production"), 3, "type: s3"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			r := build(t, tc.dir)
			var sts *appsv1.StatefulSet
			kinds := map[string]int{}
			for _, o := range r.objs {
				kinds[fmt.Sprintf("%T", o)]++
				if s, ok := o.(*appsv1.StatefulSet); ok && s.Name == "phonehome-receiver" {
					sts = s
				}
			}
			require.NotNil(t, sts)
			require.Equal(t, tc.replicas, *sts.Spec.Replicas)
			require.Len(t, sts.Spec.VolumeClaimTemplates, 1)
			c := sts.Spec.Template.Spec.Containers[0]
			require.Equal(t, "/-/ready", c.ReadinessProbe.HTTPGet.Path)
			require.Equal(t, "/-/healthy", c.LivenessProbe.HTTPGet.Path)
			require.Equal(t, 1, kinds["*v1.PodDisruptionBudget"])
			require.Equal(t, 2, kinds["*v1.Service"])
			var cfg string
			for name, cm := range r.configMaps {
				if strings.HasPrefix(name, "phonehome-receiver-config") {
					cfg = cm.Data["receiver.yaml"]
				}
			}
			require.Contains(t, cfg, tc.bucket)
		})
	}
	// The OpenShift overlay swaps the non-resource-URL ClusterRole for a Role
	// on prometheuses/api, and lets prometheus-k8s discover the forwarder's
	// endpoints in its namespace, read-only.
	r := build(t, filepath.Join(kubeDir, "overlays/openshift-cluster"))
	roles := map[string]*rbacv1.Role{}
	for _, o := range r.objs {
		_, isCR := o.(*rbacv1.ClusterRole)
		require.False(t, isCR, "openshift-cluster must not grant a ClusterRole")
		if role, ok := o.(*rbacv1.Role); ok {
			roles[role.Name] = role
		}
	}
	require.Len(t, roles, 2)
	federate := roles["phonehome-forwarder-federate"]
	require.NotNil(t, federate)
	require.Equal(t, "openshift-monitoring", federate.Namespace)
	require.Equal(t, []string{"prometheuses/api"}, federate.Rules[0].Resources)
	discover := roles["phonehome-forwarder-prometheus-k8s"]
	require.NotNil(t, discover)
	require.Equal(t, "phonehome", discover.Namespace)
	for _, rule := range discover.Rules {
		require.Equal(t, []string{"get", "list", "watch"}, rule.Verbs)
	}
}

// jobMatcher finds the job label matchers of PromQL expressions.
var jobMatcher = regexp.MustCompile(`job=~?"([^"]*)"`)

// TestServiceMonitorsScrapeWhatAlertsSelect: each build's ServiceMonitor
// selects one Service, whose name is the job its alerts select on, and
// scrapes /metrics on a Service port that leads to a declared port of the
// pods (TestProbesAndPortsServed checks that the binary listens there). Both
// receiver Services carry app.kubernetes.io/name; selecting by it alone
// scrapes every replica twice, under two jobs.
func TestServiceMonitorsScrapeWhatAlertsSelect(t *testing.T) {
	for _, tc := range []struct{ dir, alerts, job string }{
		{"overlays/production", "monitoring/receiver-alerts.yaml", "phonehome-receiver-headless"},
		{"forwarder", "forwarder/forwarder-alerts.yaml", "phonehome-forwarder"},
		{"overlays/openshift-cluster", "forwarder/forwarder-alerts.yaml", "phonehome-forwarder"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			r := build(t, filepath.Join(kubeDir, tc.dir))
			var monitors []*serviceMonitor
			var services []*corev1.Service
			for _, o := range r.objs {
				switch o := o.(type) {
				case *serviceMonitor:
					monitors = append(monitors, o)
				case *corev1.Service:
					services = append(services, o)
				}
			}
			require.Len(t, monitors, 1)
			sel, err := metav1.LabelSelectorAsSelector(&monitors[0].Spec.Selector)
			require.NoError(t, err)
			var selected []*corev1.Service
			for _, s := range services {
				if sel.Matches(k8slabels.Set(s.Labels)) {
					selected = append(selected, s)
				}
			}
			require.Len(t, selected, 1)
			svc := selected[0]
			require.Equal(t, tc.job, svc.Name, "the job is the Service's name")

			var pods []*corev1.PodTemplateSpec
			for _, pt := range r.podTemplates() {
				if k8slabels.SelectorFromSet(svc.Spec.Selector).Matches(k8slabels.Set(pt.Labels)) {
					pods = append(pods, pt)
				}
			}
			require.NotEmpty(t, pods, "Service %s selects no pod", svc.Name)
			require.NotEmpty(t, monitors[0].Spec.Endpoints)
			for _, ep := range monitors[0].Spec.Endpoints {
				require.Equal(t, "/metrics", ep.Path)
				i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
				require.GreaterOrEqual(t, i, 0, "ServiceMonitor port %q is not a port of Service %s", ep.Port, svc.Name)
				target := svc.Spec.Ports[i].TargetPort
				for _, pt := range pods {
					declared := slices.ContainsFunc(pt.Spec.Containers, func(c corev1.Container) bool {
						return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
							if target.StrVal != "" {
								return cp.Name == target.StrVal
							}
							return cp.ContainerPort == target.IntVal
						})
					})
					require.True(t, declared, "Service %s targets port %s, which its pods do not declare", svc.Name, target.String())
				}
			}

			alerts := readPrometheusRule(t, filepath.Join(kubeDir, tc.alerts))
			n := 0
			for _, g := range alerts.Spec.Groups {
				for _, rule := range g.Rules {
					for _, m := range jobMatcher.FindAllStringSubmatch(rule.Expr, -1) {
						require.Equal(t, tc.job, m[1], rule.Alert)
						n++
					}
				}
			}
			require.NotZero(t, n)
		})
	}
}

// ourContainer is a container that runs one of our binaries
// (/usr/local/bin/<binary>) in a pod template of a built kustomization.
type ourContainer struct {
	dir, workload, binary string
	r                     *rendered
	pt                    *corev1.PodTemplateSpec
	c                     corev1.Container
}

func (oc ourContainer) String() string {
	return fmt.Sprintf("%s: %s container %s", oc.dir, oc.workload, oc.c.Name)
}

// ourContainers lists the containers of every kustomization (but components,
// which are built by those that use them) that run one of our binaries.
func ourContainers(t *testing.T) []ourContainer {
	t.Helper()
	var out []ourContainer
	for _, k := range kustomizations(t) {
		if k.component {
			continue
		}
		r := build(t, k.dir)
		for name, pt := range r.podTemplates() {
			for _, c := range pt.Spec.Containers {
				if len(c.Command) == 0 || !strings.HasPrefix(c.Command[0], "/usr/local/bin/") {
					continue
				}
				out = append(out, ourContainer{dir: k.dir, workload: name, binary: filepath.Base(c.Command[0]), r: r, pt: pt, c: c})
			}
		}
	}
	return out
}

// TestProbesAndPortsServed: every probe of our containers asks for a path the
// binary serves, on a declared port that is the one the binary listens on.
func TestProbesAndPortsServed(t *testing.T) {
	served := map[string][]string{
		"receiver":  {"/-/healthy", "/-/ready", "/healthz", "/healthz/ready"},
		"forwarder": {"/healthz", "/readyz", "/healthz/ready"},
	}
	listenFlags := map[string][]string{
		"receiver":  {"--web.listen-address="},
		"forwarder": {"--listen=", "--web.listen-address="},
	}
	defaultPort := map[string]int32{"receiver": 9291, "forwarder": 9002}
	probes := 0
	for _, oc := range ourContainers(t) {
		where := oc.String()
		port := defaultPort[oc.binary]
		for _, a := range oc.c.Args {
			for _, f := range listenFlags[oc.binary] {
				if v, ok := strings.CutPrefix(a, f); ok {
					_, p, err := net.SplitHostPort(v)
					require.NoError(t, err, where)
					n, err := strconv.Atoi(p)
					require.NoError(t, err, where)
					port = int32(n)
				}
			}
		}
		for _, pr := range []*corev1.Probe{oc.c.ReadinessProbe, oc.c.LivenessProbe, oc.c.StartupProbe} {
			if pr == nil {
				continue
			}
			require.NotNil(t, pr.HTTPGet, where)
			require.Contains(t, served[oc.binary], pr.HTTPGet.Path, where)
			p := pr.HTTPGet.Port
			if p.StrVal != "" {
				idx := slices.IndexFunc(oc.c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.StrVal })
				require.GreaterOrEqual(t, idx, 0, "%s: probe port %q is not declared", where, p.StrVal)
				require.Equal(t, port, oc.c.Ports[idx].ContainerPort, "%s: port %q is not where %s listens", where, p.StrVal, oc.binary)
			} else {
				require.Equal(t, port, p.IntVal, where)
			}
			probes++
		}
	}
	require.GreaterOrEqual(t, probes, 6)
}

// TestSecurityContexts: every container of every built workload runs as
// non-root with a read-only root filesystem, no privilege escalation, no
// capabilities and the runtime's default seccomp profile, and has requests
// and limits.
func TestSecurityContexts(t *testing.T) {
	for _, k := range kustomizations(t) {
		if k.component {
			continue
		}
		for name, pt := range build(t, k.dir).podTemplates() {
			ps := pt.Spec
			for _, c := range slices.Concat(ps.InitContainers, ps.Containers) {
				where := fmt.Sprintf("%s: %s container %s", k.dir, name, c.Name)
				sc := c.SecurityContext
				require.NotNil(t, sc, where)
				nonRoot := sc.RunAsNonRoot
				if nonRoot == nil && ps.SecurityContext != nil {
					nonRoot = ps.SecurityContext.RunAsNonRoot
				}
				require.True(t, nonRoot != nil && *nonRoot, "%s: runAsNonRoot", where)
				require.True(t, sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, "%s: readOnlyRootFilesystem", where)
				require.True(t, sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, "%s: allowPrivilegeEscalation", where)
				require.NotNil(t, sc.Capabilities, where)
				require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, where)
				require.Empty(t, sc.Capabilities.Add, where)
				seccomp := sc.SeccompProfile
				if seccomp == nil && ps.SecurityContext != nil {
					seccomp = ps.SecurityContext.SeccompProfile
				}
				require.True(t, seccomp != nil && seccomp.Type == corev1.SeccompProfileTypeRuntimeDefault, "%s: seccomp RuntimeDefault", where)
				if strings.HasPrefix(c.Image, "ghcr.io/phonehome/") {
					for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
						require.Contains(t, c.Resources.Requests, res, "%s: requests", where)
						require.Contains(t, c.Resources.Limits, res, "%s: limits", where)
					}
				}
			}
		}
	}
}

var (
	digestRef = regexp.MustCompile(`^[a-z0-9.\-/:]+@sha256:[0-9a-f]{64}$`)
	// An explicit release tag: vX.Y.Z or X.Y.Z with an optional suffix.
	versionTag = regexp.MustCompile(`^[a-z0-9.\-/]+(:[0-9]+)?/[a-z0-9.\-/]+:v?[0-9]+\.[0-9]+\.[0-9]+(-[A-Za-z0-9.]+)?$`)
)

// pinned reports whether an image reference is pinned. Policy: by digest
// (preferred, and required for the Dockerfile's base images), or by an
// explicit X.Y.Z release tag for images we cannot know the digest of in the
// repository: our own (the digest exists only once the release is built) and
// the example's stand-in Prometheus. "latest", no tag, and partial tags such
// as "v3" or "1.37" are refused.
func pinned(ref string) bool {
	if digestRef.MatchString(ref) {
		return true
	}
	return versionTag.MatchString(ref) && !strings.HasSuffix(ref, ":latest")
}

func TestImagesPinned(t *testing.T) {
	for _, ref := range []string{"prometheus", "prometheus:latest", "quay.io/prometheus/prometheus:v3", "quay.io/prometheus/prometheus:v3.5", "ghcr.io/phonehome/phonehome"} {
		require.False(t, pinned(ref), ref)
	}
	for _, ref := range []string{"ghcr.io/phonehome/phonehome:v0.1.0", "quay.io/prometheus/prometheus:v3.5.0@sha256:" + strings.Repeat("a", 64)} {
		require.True(t, pinned(ref), ref)
	}

	seen := 0
	for _, k := range kustomizations(t) {
		if k.component {
			continue
		}
		for name, pt := range build(t, k.dir).podTemplates() {
			for _, c := range slices.Concat(pt.Spec.InitContainers, pt.Spec.Containers) {
				require.True(t, pinned(c.Image), "%s: %s container %s: image %q is not pinned", k.dir, name, c.Name, c.Image)
				if !strings.HasPrefix(c.Image, "ghcr.io/phonehome/") && !strings.Contains(k.dir, "examples") {
					require.Regexp(t, digestRef, c.Image, "%s: third-party image must be pinned by digest", k.dir)
				}
				seen++
			}
		}
	}
	require.Greater(t, seen, 4)

	// The Dockerfile: every base image by digest, static build, non-root.
	b, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	df := string(b)
	stages := map[string]bool{}
	froms := 0
	for _, line := range strings.Split(df, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.EqualFold(f[0], "FROM") {
			continue
		}
		froms++
		if !stages[f[1]] {
			require.Regexp(t, digestRef, f[1], "Dockerfile: FROM %s is not pinned by digest", f[1])
		}
		if len(f) == 4 && strings.EqualFold(f[2], "AS") {
			stages[f[3]] = true
		}
	}
	require.GreaterOrEqual(t, froms, 2, "Dockerfile must be multi-stage")
	require.Contains(t, df, "CGO_ENABLED=0")
	require.Regexp(t, `(?m)^USER 65532(:65532)?$`, df)
	require.Contains(t, df, "distroless/static")
	// The receiver is built with the Makefile's tags: what the tests ran.
	mk, err := os.ReadFile("../Makefile")
	require.NoError(t, err)
	tags := regexp.MustCompile(`(?m)^RECEIVER_TAGS := (\S+)$`).FindStringSubmatch(string(mk))
	require.NotNil(t, tags, "Makefile: no 'RECEIVER_TAGS := ...' line")
	require.Regexp(t, `-tags=`+regexp.QuoteMeta(tags[1])+` [^&]*-o /out/ \./cmd/receiver`, df,
		"Dockerfile: the receiver is not built with the Makefile's RECEIVER_TAGS")
}

// TestPrometheusRules runs promtool on the PrometheusRules' spec: the
// receiver's alerts against their unit tests (one scenario at least per
// alert), and checks that the in-cluster PrometheusRules (the stability rule,
// the forwarder's alerts) are the rule files deploy/prometheus owns (and
// TestPromtoolRules tests).
func TestPrometheusRules(t *testing.T) {
	alerts := readPrometheusRule(t, filepath.Join(kubeDir, "monitoring/receiver-alerts.yaml"))
	requireAlertsOnly(t, "receiver-alerts.yaml", alerts)
	dir := t.TempDir()
	rules := filepath.Join(dir, "receiver-alerts.rules.yaml")
	writeRuleFile(t, rules, alerts)
	out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
	testFile := filepath.Join(dir, "receiver-alerts.test.yaml")
	b, err := os.ReadFile(filepath.Join(kubeDir, "monitoring/receiver-alerts.test.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(testFile, b, 0o644))
	out, err = exec.Command(promtool, "test", "rules", testFile).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)
	require.Contains(t, string(out), "SUCCESS")

	// Every alert has a scenario, so a new one cannot ship untested.
	var names []string
	for _, g := range alerts.Spec.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	tested := parsePromtoolTests(t, "receiver-alerts.test.yaml", b).alerts()
	require.Empty(t, withoutScenario(names, tested), "receiver-alerts.yaml: alerts without a promtool scenario in receiver-alerts.test.yaml")

	// The in-cluster PrometheusRules carry exactly deploy/prometheus's groups.
	for cr, owned := range map[string]string{
		"forwarder/stability-rule.yaml":   "prometheus/cluster-operator-stability.rules.yaml",
		"forwarder/forwarder-alerts.yaml": "prometheus/phonehome-forwarder.rules.yaml",
	} {
		crYAML, err := os.ReadFile(filepath.Join(kubeDir, cr))
		require.NoError(t, err)
		var inCR struct {
			Spec any `yaml:"spec"`
		}
		require.NoError(t, yaml.Unmarshal(crYAML, &inCR))
		ownedYAML, err := os.ReadFile(owned)
		require.NoError(t, err)
		var groups any
		require.NoError(t, yaml.Unmarshal(ownedYAML, &groups))
		require.Equal(t, groups, inCR.Spec, "kubernetes/%s spec differs from %s: copy its groups", cr, owned)
	}
	requireAlertsOnly(t, "forwarder-alerts.yaml", readPrometheusRule(t, filepath.Join(kubeDir, "forwarder/forwarder-alerts.yaml")))
	// And the forwarder's allowlist ships what the stability rule records.
	stab := readPrometheusRule(t, filepath.Join(kubeDir, "forwarder/stability-rule.yaml"))
	matches, err := os.ReadFile(filepath.Join(kubeDir, "forwarder-config/matches.txt"))
	require.NoError(t, err)
	for _, g := range stab.Spec.Groups {
		for _, r := range g.Rules {
			require.Contains(t, string(matches), fmt.Sprintf(`{__name__=%q}`, r.Record), "matches.txt must allow %s", r.Record)
		}
	}
}

// requireAlertsOnly: every rule of pr is an alert with a known severity, a
// summary and a description.
func requireAlertsOnly(t *testing.T, name string, pr *prometheusRule) {
	t.Helper()
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "%s holds alerts only", name)
			require.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"], r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			require.NotEmpty(t, r.Annotations["description"], r.Alert)
		}
	}
}

func readPrometheusRule(t *testing.T, path string) *prometheusRule {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	obj, err := decodeStrict(b)
	require.NoError(t, err, path)
	pr, ok := obj.(*prometheusRule)
	require.True(t, ok, "%s is not a PrometheusRule", path)
	require.NotEmpty(t, pr.Spec.Groups, path)
	return pr
}

func writeRuleFile(t *testing.T, path string, pr *prometheusRule) {
	t.Helper()
	js, err := json.Marshal(pr.Spec)
	require.NoError(t, err)
	y, err := sigsyaml.JSONToYAML(js)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, y, 0o644))
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// TestMain removes the binaries once every test has run: a test's cleanup
// would take them from the next run of -count.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds ./cmd/receiver and ./cmd/forwarder once per test binary.
func binaries(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "phonehome-deploy-bin")
		if err != nil {
			binErr = err
			return
		}
		binDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "../cmd/receiver", "../cmd/forwarder")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binDir
}

// TestConfigsPassCheckConfig lays out, for every receiver and forwarder
// container of every built kustomization, the files its pod would see
// (ConfigMaps and Secrets at their mount paths, the ServiceAccount token)
// under a temporary root, expands the $(VAR) references of its args from its
// env, and runs the real binary with --check-config and the container's env
// only. Secrets that a kustomization does not ship (production's are created
// out of band) come from kubernetes/example-secrets.
func TestConfigsPassCheckConfig(t *testing.T) {
	bin := binaries(t)
	examples := build(t, filepath.Join(kubeDir, "example-secrets"))
	checked := map[string]int{}
	for _, oc := range ourContainers(t) {
		t.Run(oc.dir+"/"+oc.workload+"/"+oc.c.Name, func(t *testing.T) {
			root := t.TempDir()
			args, env := podFiles(t, root, oc.r, examples, firstPod(oc.workload), oc.pt, oc.c)
			cmd := exec.Command(filepath.Join(bin, oc.binary), append(args, "--check-config")...)
			cmd.Env = env // the container's only: the test's own could hide a missing variable
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s --check-config %s:\n%s", oc.binary, strings.Join(args, " "), out)
			require.Contains(t, string(out), "ok")
			// --check-config does not open every file a config names
			// (the receiver reads storage.bucket.s3.secret_key_file only
			// when it opens the bucket): check that each exists.
			if cfg := configFileArg(args); cfg != "" {
				requireNamedFilesExist(t, cfg)
			}
		})
		checked[oc.binary]++
	}
	// dev, production (receiver); forwarder base, openshift-cluster, sidecar example (forwarder).
	require.GreaterOrEqual(t, checked["receiver"], 3, "%v", checked)
	require.GreaterOrEqual(t, checked["forwarder"], 3, "%v", checked)
}

const saTokenDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// configFileArg is the value of the last --config.file= of args, or "".
func configFileArg(args []string) string {
	var path string
	for _, a := range args {
		if p, ok := strings.CutPrefix(a, "--config.file="); ok {
			path = p
		}
	}
	return path
}

// firstPod is the name of a workload's first pod ("StatefulSet/x": x-0).
func firstPod(workload string) string {
	return strings.ToLower(strings.SplitN(workload, "/", 2)[1]) + "-0"
}

// podFiles writes the files container c of pod template pt, in pod podName,
// would see under root and returns its args, with $(VAR)s expanded and
// paths moved under root, and its environment (NAME=value).
func podFiles(t *testing.T, root string, r, examples *rendered, podName string, pt *corev1.PodTemplateSpec, c corev1.Container) (args, environ []string) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range pt.Spec.Volumes {
		volumes[v.Name] = v
	}
	secret := func(name string) *corev1.Secret {
		if s, ok := r.secrets[name]; ok {
			return s
		}
		s, ok := examples.secrets[name]
		require.True(t, ok, "Secret %s is neither built nor an example secret", name)
		return s
	}
	// Prefixes under which paths move to root: every mount, and the token.
	prefixes := []string{saTokenDir}
	write := func(dir, key string, data []byte) {
		p := filepath.Join(root, dir, key)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, data, 0o600))
	}
	mountVolume := func(m corev1.VolumeMount) {
		prefixes = append(prefixes, m.MountPath)
		v, ok := volumes[m.Name]
		if !ok { // a volumeClaimTemplate
			require.NoError(t, os.MkdirAll(filepath.Join(root, m.MountPath), 0o755))
			return
		}
		switch {
		case v.ConfigMap != nil:
			cm, ok := r.configMaps[v.ConfigMap.Name]
			require.True(t, ok, "volume %s: ConfigMap %s not built", v.Name, v.ConfigMap.Name)
			require.Empty(t, v.ConfigMap.Items, "items are not emulated")
			for k, d := range cm.Data {
				write(m.MountPath, k, []byte(d))
			}
		case v.Secret != nil:
			require.Empty(t, v.Secret.Items, "items are not emulated")
			s := secret(v.Secret.SecretName)
			for k, d := range s.Data {
				write(m.MountPath, k, d)
			}
			for k, d := range s.StringData {
				write(m.MountPath, k, []byte(d))
			}
		case v.EmptyDir != nil:
			require.NoError(t, os.MkdirAll(filepath.Join(root, m.MountPath), 0o755))
		default:
			t.Fatalf("volume %s: only configMap, secret and emptyDir volumes are emulated", v.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		mountVolume(m)
	}
	// The kubelet's ServiceAccount token, unless automounting is off.
	if pt.Spec.AutomountServiceAccountToken == nil || *pt.Spec.AutomountServiceAccountToken {
		write(saTokenDir, "token", []byte("example-serviceaccount-token"))
	}

	// Env, for $(VAR) expansion.
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		require.NotNil(t, ef.ConfigMapRef, "only envFrom configMapRef is emulated")
		cm, ok := r.configMaps[ef.ConfigMapRef.Name]
		require.True(t, ok, "envFrom: ConfigMap %s not built", ef.ConfigMapRef.Name)
		for k, v := range cm.Data {
			env[ef.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			require.Equal(t, "metadata.name", e.ValueFrom.FieldRef.FieldPath, "env %s: only the pod's name is emulated", e.Name)
			env[e.Name] = podName
		case e.ValueFrom.ConfigMapKeyRef != nil:
			cm, ok := r.configMaps[e.ValueFrom.ConfigMapKeyRef.Name]
			require.True(t, ok, "env %s: ConfigMap not built", e.Name)
			env[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
		default:
			t.Fatalf("env %s: source not emulated", e.Name)
		}
	}

	// We ship no init container: what one would write is not emulated.
	require.Empty(t, pt.Spec.InitContainers, "init containers are not emulated")

	// Move absolute paths under root, longest prefix first, in the args and
	// in every file the pod sees (configs name other files by absolute path).
	sort.Slice(prefixes, func(i, j int) bool { return len(prefixes[i]) > len(prefixes[j]) })
	var pairs []string
	for _, p := range slices.Compact(prefixes) {
		pairs = append(pairs, p, filepath.Join(root, p))
	}
	rewrite := strings.NewReplacer(pairs...)
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(path, []byte(rewrite.Replace(string(b))), 0o600)
	}))
	varRef := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	args = make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		a = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			require.True(t, ok, "arg %q: $(%s) is not in the container's env (Kubernetes would pass it literally)", a, name)
			return v
		})
		args = append(args, rewrite.Replace(a))
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		environ = append(environ, k+"="+env[k])
	}
	return args, environ
}

// TestGrafanaProvisioning: every dashboard of deploy/grafana is in the
// dashboards ConfigMap, as valid JSON, beside the data source and provider.
func TestGrafanaProvisioning(t *testing.T) {
	r := build(t, grafanaDir)
	dash, ok := r.configMaps["phonehome-grafana-dashboards"]
	require.True(t, ok)
	require.Equal(t, "1", dash.Labels["grafana_dashboard"])
	files, err := filepath.Glob("grafana/dashboards/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		data, ok := dash.Data[filepath.Base(f)]
		require.True(t, ok, "%s is not in kubernetes/grafana/kustomization.yaml", f)
		require.True(t, json.Valid([]byte(data)), f)
	}
	require.Len(t, dash.Data, len(files))
	size := 0
	for _, d := range dash.Data {
		size += len(d)
	}
	require.Less(t, size, 900<<10, "a ConfigMap holds at most 1 MiB: split the dashboards")
	ds, ok := r.configMaps["phonehome-grafana-datasource"]
	require.True(t, ok)
	require.Equal(t, "1", ds.Labels["grafana_datasource"])
	require.Contains(t, ds.Data["phonehome-datasource.yaml"], "http://phonehome-receiver:9291", "the data source must point at the receiver Service")
	require.Contains(t, r.configMaps, "phonehome-grafana-dashboard-provider")
}

// requireNamedFilesExist fails if a value of a key ending in _file (or the
// files of tokens_file/keys_file's own private_key_file) in the YAML config
// does not name an existing file, relative paths being relative to the config.
func requireNamedFilesExist(t *testing.T, config string) {
	t.Helper()
	b, err := os.ReadFile(config)
	require.NoError(t, err)
	var doc any
	require.NoError(t, yaml.Unmarshal(b, &doc))
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if s, ok := e.(string); ok && strings.HasSuffix(k, "_file") && s != "" {
					if !filepath.IsAbs(s) {
						s = filepath.Join(filepath.Dir(config), s)
					}
					_, err := os.Stat(s)
					require.NoError(t, err, "%s: %s%s names a file the pod does not have", config, path, k)
					continue
				}
				walk(path+k+".", e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s%d.", path, i), e)
			}
		}
	}
	walk("", doc)
}
