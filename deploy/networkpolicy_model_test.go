package deploy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A model of NetworkPolicy semantics, as much as networkpolicy_test.go needs
// to ask "may this connection be opened?" without a cluster: pods are matched
// by labels and namespace (whose label kubernetes.io/metadata.name Kubernetes
// sets), addresses outside the cluster by ipBlock, and a named port is the
// destination pod's port of that name.

// endpoint is one end of a connection: a pod, or an address outside the cluster.
type endpoint struct {
	namespace string
	labels    map[string]string
	ports     []corev1.ContainerPort // a pod's declared ports, for named policy ports
	addr      netip.Addr             // valid for an address outside the cluster
}

func (e endpoint) outside() bool { return e.addr.IsValid() }

func podEndpoint(namespace string, pt *corev1.PodTemplateSpec) endpoint {
	var ports []corev1.ContainerPort
	for _, c := range pt.Spec.Containers {
		ports = append(ports, c.Ports...)
	}
	return endpoint{namespace: namespaceOrDefault(namespace), labels: pt.Labels, ports: ports}
}

// namespaceOrDefault: an object without a namespace lands in the one kubectl
// applies it to; the tests call it default.
func namespaceOrDefault(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

type connection struct {
	src, dst endpoint
	port     int32
	protocol corev1.Protocol
}

// allows reports whether the policies let the connection through: the
// source's egress and the destination's ingress must both allow it.
func allows(pols []*networkingv1.NetworkPolicy, c connection) bool {
	return allowedBy(pols, c, networkingv1.PolicyTypeEgress) && allowedBy(pols, c, networkingv1.PolicyTypeIngress)
}

// allowedBy applies the policies of one side: a pod that no policy selects
// for that direction is not isolated in it; otherwise one rule of one of
// those policies must allow the connection.
func allowedBy(pols []*networkingv1.NetworkPolicy, c connection, dir networkingv1.PolicyType) bool {
	self, other := c.src, c.dst
	if dir == networkingv1.PolicyTypeIngress {
		self, other = c.dst, c.src
	}
	if self.outside() {
		return true // no policy applies there
	}
	isolated := false
	for _, p := range selecting(pols, self, dir) {
		isolated = true
		for _, r := range rulesOf(p, dir) {
			if peersMatch(r.peers, p.Namespace, other) && portsMatch(r.ports, c) {
				return true
			}
		}
	}
	return !isolated
}

// selecting returns the policies that select pod for dir.
func selecting(pols []*networkingv1.NetworkPolicy, pod endpoint, dir networkingv1.PolicyType) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for _, p := range pols {
		// policyTypes is spelled out in every policy (networkpolicy_test.go
		// checks), so its defaults need no modelling.
		if namespaceOrDefault(p.Namespace) == pod.namespace && slices.Contains(p.Spec.PolicyTypes, dir) &&
			labelsMatch(&p.Spec.PodSelector, pod.labels) {
			out = append(out, p)
		}
	}
	return out
}

// policyRule is an ingress or egress rule: the other ends and the ports.
type policyRule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

func rulesOf(p *networkingv1.NetworkPolicy, dir networkingv1.PolicyType) []policyRule {
	var out []policyRule
	if dir == networkingv1.PolicyTypeIngress {
		for _, r := range p.Spec.Ingress {
			out = append(out, policyRule{r.From, r.Ports})
		}
		return out
	}
	for _, r := range p.Spec.Egress {
		out = append(out, policyRule{r.To, r.Ports})
	}
	return out
}

// peersMatch: no peers means any; policyNS is the namespace a peer with a pod
// selector alone refers to.
func peersMatch(peers []networkingv1.NetworkPolicyPeer, policyNS string, e endpoint) bool {
	return len(peers) == 0 || slices.ContainsFunc(peers, func(p networkingv1.NetworkPolicyPeer) bool {
		return peerMatches(p, policyNS, e)
	})
}

func peerMatches(p networkingv1.NetworkPolicyPeer, policyNS string, e endpoint) bool {
	if p.IPBlock != nil {
		if !e.outside() {
			return false // pods' addresses are not modelled
		}
		block, err := netip.ParsePrefix(p.IPBlock.CIDR)
		if err != nil || !block.Contains(e.addr) {
			return false
		}
		return !slices.ContainsFunc(p.IPBlock.Except, func(ex string) bool {
			pre, err := netip.ParsePrefix(ex)
			return err == nil && pre.Contains(e.addr)
		})
	}
	if e.outside() {
		return false
	}
	if p.NamespaceSelector == nil {
		if e.namespace != namespaceOrDefault(policyNS) {
			return false
		}
	} else if !labelsMatch(p.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": e.namespace}) {
		return false
	}
	return p.PodSelector == nil || labelsMatch(p.PodSelector, e.labels)
}

// portsMatch: no ports means all; a named port is the destination pod's.
func portsMatch(ports []networkingv1.NetworkPolicyPort, c connection) bool {
	return len(ports) == 0 || slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool {
		if protocolOrTCP(p.Protocol) != protocolOrTCP(&c.protocol) {
			return false
		}
		if p.Port == nil {
			return true
		}
		n, ok := resolvePort(p, c.dst.ports)
		if !ok {
			return false
		}
		if p.EndPort != nil {
			return n <= c.port && c.port <= *p.EndPort
		}
		return n == c.port
	})
}

// resolvePort returns the number of a policy port: itself, or the number of
// the container port of that name and protocol.
func resolvePort(p networkingv1.NetworkPolicyPort, ports []corev1.ContainerPort) (int32, bool) {
	if p.Port.Type == intstr.Int {
		return p.Port.IntVal, true
	}
	i := slices.IndexFunc(ports, func(cp corev1.ContainerPort) bool {
		return cp.Name == p.Port.StrVal && protocolOrTCP(&cp.Protocol) == protocolOrTCP(p.Protocol)
	})
	if i < 0 {
		return 0, false
	}
	return ports[i].ContainerPort, true
}

func protocolOrTCP(p *corev1.Protocol) corev1.Protocol {
	if p == nil || *p == "" {
		return corev1.ProtocolTCP
	}
	return *p
}

// labelsMatch: an invalid selector matches nothing (networkpolicy_test.go
// reports it).
func labelsMatch(sel *metav1.LabelSelector, labels map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(k8slabels.Set(labels))
}

// TestNetworkPolicyModel pins the semantics the model implements on a policy
// that uses each kind of peer and port.
func TestNetworkPolicyModel(t *testing.T) {
	obj, err := decodeStrict([]byte(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: app}
spec:
  podSelector: {matchLabels: {role: web}}
  policyTypes: [Ingress, Egress]
  ingress:
    - from: [{podSelector: {matchLabels: {role: lb}}}]
      ports: [{port: http}]
    - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]
      ports: [{port: 9000, endPort: 9010}]
    - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: prom}}}]
      ports: [{port: 7000}]
  egress:
    - to: [{ipBlock: {cidr: 198.51.100.0/24, except: [198.51.100.128/25]}}]
      ports: [{port: 443}]
    - ports: [{port: 53, protocol: UDP}]
    - to: [{podSelector: {matchLabels: {role: db}}}]
      ports: [{port: sql}]
`))
	require.NoError(t, err)
	pols := []*networkingv1.NetworkPolicy{obj.(*networkingv1.NetworkPolicy)}
	web := endpoint{namespace: "app", labels: map[string]string{"role": "web"}, ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}
	lb := endpoint{namespace: "app", labels: map[string]string{"role": "lb"}}
	lbElsewhere := endpoint{namespace: "other", labels: map[string]string{"role": "lb"}}
	monitoring := endpoint{namespace: "monitoring", labels: map[string]string{"any": "pod"}}
	prom := endpoint{namespace: "other", labels: map[string]string{"role": "prom"}}
	db := endpoint{namespace: "app", labels: map[string]string{"role": "db"}, ports: []corev1.ContainerPort{{Name: "sql", ContainerPort: 5432}}}
	addr := func(s string) endpoint { return endpoint{addr: netip.MustParseAddr(s)} }
	for _, tc := range []struct {
		what string
		c    connection
		want bool
	}{
		{"named port, pod selector in the policy's namespace", connection{lb, web, 8080, corev1.ProtocolTCP}, true},
		{"named port on another number", connection{lb, web, 8081, corev1.ProtocolTCP}, false},
		{"named port over UDP", connection{lb, web, 8080, corev1.ProtocolUDP}, false},
		{"pod selector alone: another namespace", connection{lbElsewhere, web, 8080, corev1.ProtocolTCP}, false},
		{"namespace selector, port range", connection{monitoring, web, 9005, corev1.ProtocolTCP}, true},
		{"namespace selector, outside the range", connection{monitoring, web, 9011, corev1.ProtocolTCP}, false},
		{"from outside the cluster", connection{addr("198.51.100.1"), web, 8080, corev1.ProtocolTCP}, false},
		{"namespace and pod selectors in one peer: both match", connection{prom, web, 7000, corev1.ProtocolTCP}, true},
		{"namespace and pod selectors in one peer: the pod's labels differ", connection{monitoring, web, 7000, corev1.ProtocolTCP}, false},
		{"egress named port: the destination's", connection{web, db, 5432, corev1.ProtocolTCP}, true},
		{"egress named port: another number", connection{web, db, 8080, corev1.ProtocolTCP}, false},
		{"ipBlock", connection{web, addr("198.51.100.1"), 443, corev1.ProtocolTCP}, true},
		{"ipBlock except", connection{web, addr("198.51.100.200"), 443, corev1.ProtocolTCP}, false},
		{"ipBlock: not a pod", connection{web, lb, 443, corev1.ProtocolTCP}, false},
		{"no peers: any destination", connection{web, lbElsewhere, 53, corev1.ProtocolUDP}, true},
		{"not isolated: pods no policy selects", connection{lb, lbElsewhere, 25, corev1.ProtocolTCP}, true},
	} {
		require.Equal(t, tc.want, allows(pols, tc.c), tc.what)
	}
}
