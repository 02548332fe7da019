package limits

import (
	"github.com/prometheus/prometheus/model/labels"
)

// CheckLabels returns a *LimitError if ls has more labels than
// max_label_names_per_series, or a label name or value longer than
// max_label_name_length or max_label_value_length (in bytes) of tenant.
// A label with an empty value is not counted or checked: an empty value
// means the label is absent (Prometheus' data model), and it is not stored.
// It only reads ls. For many series of one request, Session.CheckLabels
// avoids looking the tenant's limits up each time.
func (l *Limiter) CheckLabels(tenant string, ls labels.Labels) error {
	return l.checkLabels(l.cfg.Load().forTenant(tenant), ls)
}

func (l *Limiter) checkLabels(lim *TenantLimits, ls labels.Labels) error {
	if limit := lim.MaxLabelNamesPerSeries; limit > 0 && ls.Len() > limit && present(ls) > limit {
		return l.reject(LimitLabelNamesPerSeries, float64(limit))
	}
	maxName, maxValue := lim.MaxLabelNameLength, lim.MaxLabelValueLength
	if maxName <= 0 && maxValue <= 0 {
		return nil
	}
	return ls.Validate(func(lb labels.Label) error {
		if lb.Value == "" {
			return nil
		}
		if maxName > 0 && len(lb.Name) > maxName {
			return l.reject(LimitLabelNameLength, float64(maxName))
		}
		if maxValue > 0 && len(lb.Value) > maxValue {
			return l.reject(LimitLabelValueLength, float64(maxValue))
		}
		return nil
	})
}

// present counts the labels of ls with a value.
func present(ls labels.Labels) int {
	n := 0
	ls.Range(func(lb labels.Label) {
		if lb.Value != "" {
			n++
		}
	})
	return n
}

// CheckBodyBytes returns a *LimitError (ErrTooLarge) if a compressed body of
// n bytes exceeds tenant's max_body_bytes. The receiver should also read
// the body through an io.LimitReader of For(tenant).MaxBodyBytes+1.
func (l *Limiter) CheckBodyBytes(tenant string, n int64) error {
	if max := l.cfg.Load().forTenant(tenant).MaxBodyBytes; n > max {
		return l.reject(LimitBodyBytes, float64(max))
	}
	return nil
}

// CheckDecodedBytes returns a *LimitError (ErrTooLarge) if a body that
// decompresses to n bytes exceeds tenant's max_decoded_bytes. Call it with
// snappy.DecodedLen before decoding.
func (l *Limiter) CheckDecodedBytes(tenant string, n int64) error {
	if max := l.cfg.Load().forTenant(tenant).MaxDecodedBytes; n > max {
		return l.reject(LimitDecodedBytes, float64(max))
	}
	return nil
}
