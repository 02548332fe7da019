package deploy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/phonehome/phonehome/receive"
)

// netBuild is one built kustomization's NetworkPolicies and pods.
type netBuild struct {
	dir      string
	policies []*networkingv1.NetworkPolicy
	pods     []netPod
	// own: the workloads whose every container runs one of our binaries.
	// The others (a Prometheus with the forwarder as a sidecar) are shared
	// with containers that are not ours to isolate.
	own map[string]bool
}

// netPod is a workload's pod template, as an endpoint in its namespace.
type netPod struct {
	workload string // Kind/name, as podTemplates names it
	pt       *corev1.PodTemplateSpec
	endpoint endpoint
}

func newNetBuild(dir string, r *rendered, ours []ourContainer) netBuild {
	b := netBuild{dir: dir, own: map[string]bool{}}
	namespaces := map[string]string{}
	for _, o := range r.objs {
		if np, ok := o.(*networkingv1.NetworkPolicy); ok {
			b.policies = append(b.policies, np)
		}
		ro, okR := o.(runtime.Object)
		mo, okM := o.(metav1.Object)
		if okR && okM {
			namespaces[ro.GetObjectKind().GroupVersionKind().Kind+"/"+mo.GetName()] = mo.GetNamespace()
		}
	}
	for name, pt := range r.podTemplates() {
		b.pods = append(b.pods, netPod{workload: name, pt: pt, endpoint: podEndpoint(namespaces[name], pt)})
		n := 0
		for _, oc := range ours {
			if oc.dir == dir && oc.workload == name {
				n++
			}
		}
		b.own[name] = n == len(pt.Spec.Containers)
	}
	slices.SortFunc(b.pods, func(a, b netPod) int { return strings.Compare(a.workload, b.workload) })
	return b
}

func (b netBuild) pod(t *testing.T, workload string) netPod {
	t.Helper()
	i := slices.IndexFunc(b.pods, func(p netPod) bool { return p.workload == workload })
	require.GreaterOrEqual(t, i, 0, "%s: no workload %s", b.dir, workload)
	return b.pods[i]
}

// netBuilds builds every kustomization (but components, built by those that
// use them) that runs pods.
func netBuilds(t *testing.T) []netBuild {
	t.Helper()
	ours := ourContainers(t)
	var out []netBuild
	for _, k := range kustomizations(t) {
		if k.component {
			continue
		}
		if b := newNetBuild(k.dir, build(t, k.dir), ours); len(b.pods) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// TestNetworkPoliciesSelectEveryPod: every pod that ships is isolated by a
// NetworkPolicy of its build (ours both ways; a pod shared with containers
// that are not ours, for egress, the sidecar's opt-in), and every policy
// selects a pod of its build (a policy whose selector no longer matches
// protects nothing).
func TestNetworkPoliciesSelectEveryPod(t *testing.T) {
	builds := netBuilds(t)
	pods := 0
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			require.NoError(t, errors.Join(checkPolicyCoverage(b)...))
		})
		pods += len(b.pods)
	}
	// dev, production, forwarder, openshift-cluster, examples/sidecar.
	require.GreaterOrEqual(t, pods, 5, "checked too few pods: is the walk broken?")
}

func checkPolicyCoverage(b netBuild) []error {
	var errs []error
	for _, p := range b.policies {
		if len(p.Spec.PolicyTypes) == 0 {
			errs = append(errs, fmt.Errorf("NetworkPolicy %s: spell out policyTypes", p.Name))
		}
		for _, sel := range policySelectors(p) {
			if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
				errs = append(errs, fmt.Errorf("NetworkPolicy %s: %w", p.Name, err))
			}
		}
		if !slices.ContainsFunc(b.pods, func(pod netPod) bool { return policySelects(p, pod.endpoint) }) {
			errs = append(errs, fmt.Errorf("NetworkPolicy %s selects no pod", p.Name))
		}
	}
	for _, pod := range b.pods {
		dirs := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		if b.own[pod.workload] {
			dirs = append(dirs, networkingv1.PolicyTypeIngress)
		}
		for _, dir := range dirs {
			if len(selecting(b.policies, pod.endpoint, dir)) == 0 {
				errs = append(errs, fmt.Errorf("%s: no NetworkPolicy isolates its %s", pod.workload, dir))
			}
		}
	}
	return errs
}

func policySelects(p *networkingv1.NetworkPolicy, pod endpoint) bool {
	return namespaceOrDefault(p.Namespace) == pod.namespace && labelsMatch(&p.Spec.PodSelector, pod.labels)
}

func policySelectors(p *networkingv1.NetworkPolicy) []*metav1.LabelSelector {
	sels := []*metav1.LabelSelector{&p.Spec.PodSelector}
	var peers []networkingv1.NetworkPolicyPeer
	for _, r := range slices.Concat(rulesOf(p, networkingv1.PolicyTypeIngress), rulesOf(p, networkingv1.PolicyTypeEgress)) {
		peers = append(peers, r.peers...)
	}
	for _, peer := range peers {
		for _, s := range []*metav1.LabelSelector{peer.PodSelector, peer.NamespaceSelector} {
			if s != nil {
				sels = append(sels, s)
			}
		}
	}
	return sels
}

// TestNetworkPolicyPortsMatchContainers: the policies' ports are the pods'
// (a named port is dropped if no container declares it), and every port of an
// isolated pod is open to someone; a container port renamed without its
// policy fails.
func TestNetworkPolicyPortsMatchContainers(t *testing.T) {
	builds := netBuilds(t)
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			require.NoError(t, errors.Join(checkPolicyPorts(b)...))
		})
	}
	// The check itself catches a renamed port: the receiver's, which its
	// peers reach as well, and the forwarder's.
	for _, tc := range []struct{ dir, workload string }{
		{"overlays/production", "StatefulSet/phonehome-receiver"},
		{"forwarder", "Deployment/phonehome-forwarder"},
	} {
		i := slices.IndexFunc(builds, func(b netBuild) bool { return b.dir == filepath.Join(kubeDir, tc.dir) })
		require.GreaterOrEqual(t, i, 0, tc.dir)
		b := withRenamedPort(t, builds[i], tc.workload)
		require.NotEmpty(t, checkPolicyPorts(b), "%s: renaming %s's port went unnoticed", tc.dir, tc.workload)
	}
}

func checkPolicyPorts(b netBuild) []error {
	var errs []error
	for _, p := range b.policies {
		for _, pod := range b.pods {
			if !policySelects(p, pod.endpoint) {
				continue
			}
			for _, r := range rulesOf(p, networkingv1.PolicyTypeIngress) {
				for _, port := range r.ports {
					if port.Port == nil {
						continue
					}
					n, ok := resolvePort(port, pod.endpoint.ports)
					if !ok || !declaresPort(pod.endpoint.ports, n, protocolOrTCP(port.Protocol)) {
						errs = append(errs, fmt.Errorf("NetworkPolicy %s: ingress port %s is no port of %s", p.Name, port.Port.String(), pod.workload))
					}
				}
			}
		}
		// A named egress port is the destination pod's: it must name a port
		// of a pod the rule lets this one reach.
		for _, r := range rulesOf(p, networkingv1.PolicyTypeEgress) {
			for _, port := range r.ports {
				if port.Port == nil || port.Port.Type == intstr.Int {
					continue
				}
				reached := slices.ContainsFunc(b.pods, func(pod netPod) bool {
					_, ok := resolvePort(port, pod.endpoint.ports)
					return len(r.peers) > 0 && peersMatch(r.peers, p.Namespace, pod.endpoint) && ok
				})
				if !reached {
					errs = append(errs, fmt.Errorf("NetworkPolicy %s: egress port %s is no port of a pod it lets it reach", p.Name, port.Port.String()))
				}
			}
		}
	}
	for _, pod := range b.pods {
		pols := selecting(b.policies, pod.endpoint, networkingv1.PolicyTypeIngress)
		if len(pols) == 0 {
			continue
		}
		for _, cp := range pod.endpoint.ports {
			c := connection{dst: pod.endpoint, port: cp.ContainerPort, protocol: protocolOrTCP(&cp.Protocol)}
			open := slices.ContainsFunc(pols, func(p *networkingv1.NetworkPolicy) bool {
				return slices.ContainsFunc(rulesOf(p, networkingv1.PolicyTypeIngress), func(r policyRule) bool { return portsMatch(r.ports, c) })
			})
			if !open {
				errs = append(errs, fmt.Errorf("%s: port %q (%d) is open to no one: no ingress rule of its NetworkPolicies names it", pod.workload, cp.Name, cp.ContainerPort))
			}
		}
	}
	return errs
}

func declaresPort(ports []corev1.ContainerPort, n int32, proto corev1.Protocol) bool {
	return slices.ContainsFunc(ports, func(cp corev1.ContainerPort) bool {
		return cp.ContainerPort == n && protocolOrTCP(&cp.Protocol) == proto
	})
}

// withRenamedPort returns b with the first port of workload's first
// container renamed, as an edit that forgets the policy would.
func withRenamedPort(t *testing.T, b netBuild, workload string) netBuild {
	t.Helper()
	pod := b.pod(t, workload)
	pt := pod.pt.DeepCopy()
	require.NotEmpty(t, pt.Spec.Containers[0].Ports, workload)
	pt.Spec.Containers[0].Ports[0].Name += "-renamed"
	out := b
	out.pods = slices.Clone(b.pods)
	out.pods[slices.IndexFunc(out.pods, func(p netPod) bool { return p.workload == workload })] =
		netPod{workload: workload, pt: pt, endpoint: podEndpoint(pod.endpoint.namespace, pt)}
	return out
}

// Endpoints the flows below connect to or from. The addresses are TEST-NET-3.
var (
	outsideAddr = endpoint{addr: netip.MustParseAddr("203.0.113.7")} // a cluster, S3, the receiver's load balancer
	dnsPod      = endpoint{namespace: "kube-system", labels: map[string]string{"k8s-app": "kube-dns"}, ports: []corev1.ContainerPort{
		{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
	}}
	openshiftDNSPod = endpoint{namespace: "openshift-dns", labels: map[string]string{"dns.operator.openshift.io/daemonset-dns": "default"}, ports: []corev1.ContainerPort{
		{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}, {Name: "dns-tcp", ContainerPort: 5353, Protocol: corev1.ProtocolTCP},
	}}
	prometheusPod   = endpoint{namespace: "openshift-monitoring", labels: map[string]string{"app.kubernetes.io/name": "prometheus"}}
	grafanaPod      = endpoint{namespace: "monitoring", labels: map[string]string{"app.kubernetes.io/name": "grafana"}}
	alertmanagerPod = endpoint{namespace: "monitoring", labels: map[string]string{"app.kubernetes.io/name": "alertmanager"}}
	strangerPod     = endpoint{namespace: "default", labels: map[string]string{"app": "stranger"}}
)

// flow is a connection the policies must allow, or must not.
type flow struct {
	what    string
	c       connection
	allowed bool
}

// TestNetworkPolicyFlows: for every receiver and forwarder container that
// ships, the policies let through what its configuration connects to and
// what connects to it (clusters through the load balancer, Grafana, the
// monitoring Prometheus, the peers, DNS, the bucket, the cluster's Prometheus,
// the receiver), and keep out the rest.
func TestNetworkPolicyFlows(t *testing.T) {
	examples := build(t, filepath.Join(kubeDir, "example-secrets"))
	ours := ourContainers(t)
	checked := map[string]int{}
	for _, oc := range ours {
		t.Run(oc.dir+"/"+oc.workload+"/"+oc.c.Name, func(t *testing.T) {
			b := newNetBuild(oc.dir, oc.r, ours)
			pod := b.pod(t, oc.workload)
			// The args as the pod runs them, and the files they name.
			args, env := podFiles(t, t.TempDir(), oc.r, examples, firstPod(oc.workload), oc.pt, oc.c)
			var flows []flow
			switch oc.binary {
			case "receiver":
				setEnv(t, env)
				flows = receiverFlows(t, pod.endpoint, oc.c, args)
			case "forwarder":
				flows = forwarderFlows(t, pod.endpoint, b.own[oc.workload], oc.c, args)
			default:
				t.Fatalf("no flows known for %s", oc.binary)
			}
			self := pod.endpoint
			for _, dns := range []endpoint{dnsPod, openshiftDNSPod} {
				for _, cp := range dns.ports {
					flows = append(flows, flow{fmt.Sprintf("DNS (%s/%d)", cp.Protocol, cp.ContainerPort), connection{self, dns, cp.ContainerPort, cp.Protocol}, true})
				}
			}
			flows = append(flows, flow{"anything else out: SMTP", connection{self, outsideAddr, 25, corev1.ProtocolTCP}, false})
			for _, f := range flows {
				require.Equal(t, f.allowed, allows(b.policies, f.c), "%s (allowed: %v)", f.what, f.allowed)
			}
		})
		checked[oc.binary]++
	}
	require.GreaterOrEqual(t, checked["receiver"], 2, "%v", checked)
	require.GreaterOrEqual(t, checked["forwarder"], 3, "%v", checked)
}

// receiverFlows: everyone reaches the receiver's ports (clusters come through
// the load balancer, from outside), the replicas reach each other (peers),
// and it reaches what its configuration, loaded by the receiver's loader,
// names.
func receiverFlows(t *testing.T, self endpoint, c corev1.Container, args []string) []flow {
	t.Helper()
	flows := inboundFlows(self, c,
		inbound{"a cluster, through the load balancer,", outsideAddr, true},
		inbound{"Grafana", grafanaPod, true},
		inbound{"the monitoring Prometheus", prometheusPod, true},
		inbound{"a peer (another replica)", self, true},
	)
	cfgFile := configFileArg(args)
	require.NotEmpty(t, cfgFile, "no --config.file in %v", args)
	cfg, err := receive.LoadConfig(cfgFile) // as the pod loads it: its env is set
	require.NoError(t, err)
	out := func(what string, dst endpoint, port int32) flow {
		return flow{what, connection{self, dst, port, corev1.ProtocolTCP}, true}
	}
	if cfg.Storage.Bucket.Type == "s3" {
		port := int32(443)
		if cfg.Storage.Bucket.S3.Insecure {
			port = 80
		}
		if _, p, err := net.SplitHostPort(cfg.Storage.Bucket.S3.Endpoint); err == nil {
			port = parsePort(t, p)
		}
		flows = append(flows, out("the S3 bucket "+cfg.Storage.Bucket.S3.Endpoint, outsideAddr, port))
	}
	if w := cfg.Auth.AuthorizeWebhook; w != nil {
		flows = append(flows, out("the authorize webhook "+w.URL, outsideAddr, urlPort(t, w.URL)))
	}
	if cfg.Upstream.URL != "" {
		flows = append(flows, out("the upstream "+cfg.Upstream.URL, outsideAddr, urlPort(t, cfg.Upstream.URL)))
	}
	for _, am := range cfg.Rules.Alertmanagers {
		flows = append(flows, out("Alertmanager "+am.URL, alertmanagerPod, urlPort(t, am.URL)))
	}
	return flows
}

// forwarderFlows: the forwarder reaches the cluster's Prometheus (--from,
// unless over localhost, which policies do not see) and the receiver outside
// (--to and the other receiver URLs). Its own pod is scraped by the cluster's
// Prometheus only; a sidecar's pod is its Prometheus', not ours to close.
func forwarderFlows(t *testing.T, self endpoint, ownPod bool, c corev1.Container, args []string) []flow {
	t.Helper()
	var flows []flow
	for _, a := range args {
		name, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || v == "" {
			continue
		}
		switch name {
		case "from":
			u, err := url.Parse(v)
			require.NoError(t, err)
			if ip, err := netip.ParseAddr(u.Hostname()); u.Hostname() == "localhost" || (err == nil && ip.IsLoopback()) {
				continue
			}
			flows = append(flows, flow{"the cluster's Prometheus " + v, connection{self, prometheusPod, urlPort(t, v), corev1.ProtocolTCP}, true})
		case "to", "to-upload", "to-auth", "gathering-url":
			flows = append(flows, flow{"the receiver " + v, connection{self, outsideAddr, urlPort(t, v), corev1.ProtocolTCP}, true})
		}
	}
	require.NotEmpty(t, flows, "no --from or --to in %v", args)
	if !ownPod {
		return flows
	}
	return append(flows, inboundFlows(self, c,
		inbound{"the cluster's Prometheus", prometheusPod, true},
		inbound{"another pod", strangerPod, false},
		inbound{"outside the cluster", outsideAddr, false},
	)...)
}

// inbound is a source of connections to a container's ports.
type inbound struct {
	what    string
	from    endpoint
	allowed bool
}

// inboundFlows returns a flow from each source to each port of c.
func inboundFlows(self endpoint, c corev1.Container, sources ...inbound) []flow {
	var flows []flow
	for _, cp := range c.Ports {
		for _, src := range sources {
			conn := connection{src.from, self, cp.ContainerPort, protocolOrTCP(&cp.Protocol)}
			flows = append(flows, flow{src.what + " to port " + cp.Name, conn, src.allowed})
		}
	}
	return flows
}

// urlPort is the port a URL connects to.
func urlPort(t *testing.T, raw string) int32 {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	if p := u.Port(); p != "" {
		return parsePort(t, p)
	}
	ports := map[string]int32{"https": 443, "http": 80}
	port, ok := ports[u.Scheme]
	require.True(t, ok, "%s: no port and scheme %q", raw, u.Scheme)
	return port
}

func parsePort(t *testing.T, s string) int32 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 16)
	require.NoError(t, err)
	return int32(n)
}
