//! The platform's currency (issue 46): an ISO 4217 code with its minor units, the operator's
//! setting (`serve --currency RUB`). Every price and amount is an integer count of its minor
//! units (kopecks, cents; yen have none).

/// A currency the platform knows: its ISO 4217 code and how many decimal places its minor unit
/// has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Currency {
    pub code: &'static str,
    pub minor_units: u8,
}

/// The default when the operator sets none.
pub const DEFAULT: Currency = Currency { code: "RUB", minor_units: 2 };

/// ISO 4217's active currencies with their minor units (funds and precious metals left out).
#[rustfmt::skip]
const TABLE: &[(&str, u8)] = &[
    ("AED", 2), ("AFN", 2), ("ALL", 2), ("AMD", 2), ("ANG", 2), ("AOA", 2), ("ARS", 2),
    ("AUD", 2), ("AWG", 2), ("AZN", 2), ("BAM", 2), ("BBD", 2), ("BDT", 2), ("BGN", 2),
    ("BHD", 3), ("BIF", 0), ("BMD", 2), ("BND", 2), ("BOB", 2), ("BRL", 2), ("BSD", 2),
    ("BTN", 2), ("BWP", 2), ("BYN", 2), ("BZD", 2), ("CAD", 2), ("CDF", 2), ("CHF", 2),
    ("CLP", 0), ("CNY", 2), ("COP", 2), ("CRC", 2), ("CUP", 2), ("CVE", 2), ("CZK", 2),
    ("DJF", 0), ("DKK", 2), ("DOP", 2), ("DZD", 2), ("EGP", 2), ("ERN", 2), ("ETB", 2),
    ("EUR", 2), ("FJD", 2), ("FKP", 2), ("GBP", 2), ("GEL", 2), ("GHS", 2), ("GIP", 2),
    ("GMD", 2), ("GNF", 0), ("GTQ", 2), ("GYD", 2), ("HKD", 2), ("HNL", 2), ("HTG", 2),
    ("HUF", 2), ("IDR", 2), ("ILS", 2), ("INR", 2), ("IQD", 3), ("IRR", 2), ("ISK", 0),
    ("JMD", 2), ("JOD", 3), ("JPY", 0), ("KES", 2), ("KGS", 2), ("KHR", 2), ("KMF", 0),
    ("KPW", 2), ("KRW", 0), ("KWD", 3), ("KYD", 2), ("KZT", 2), ("LAK", 2), ("LBP", 2),
    ("LKR", 2), ("LRD", 2), ("LSL", 2), ("LYD", 3), ("MAD", 2), ("MDL", 2), ("MGA", 2),
    ("MKD", 2), ("MMK", 2), ("MNT", 2), ("MOP", 2), ("MRU", 2), ("MUR", 2), ("MVR", 2),
    ("MWK", 2), ("MXN", 2), ("MYR", 2), ("MZN", 2), ("NAD", 2), ("NGN", 2), ("NIO", 2),
    ("NOK", 2), ("NPR", 2), ("NZD", 2), ("OMR", 3), ("PAB", 2), ("PEN", 2), ("PGK", 2),
    ("PHP", 2), ("PKR", 2), ("PLN", 2), ("PYG", 0), ("QAR", 2), ("RON", 2), ("RSD", 2),
    ("RUB", 2), ("RWF", 0), ("SAR", 2), ("SBD", 2), ("SCR", 2), ("SDG", 2), ("SEK", 2),
    ("SGD", 2), ("SHP", 2), ("SLE", 2), ("SOS", 2), ("SRD", 2), ("SSP", 2), ("STN", 2),
    ("SVC", 2), ("SYP", 2), ("SZL", 2), ("THB", 2), ("TJS", 2), ("TMT", 2), ("TND", 3),
    ("TOP", 2), ("TRY", 2), ("TTD", 2), ("TWD", 2), ("TZS", 2), ("UAH", 2), ("UGX", 0),
    ("USD", 2), ("UYU", 2), ("UZS", 2), ("VED", 2), ("VES", 2), ("VND", 0), ("VUV", 0),
    ("WST", 2), ("XAF", 0), ("XCD", 2), ("XOF", 0), ("XPF", 0), ("YER", 2), ("ZAR", 2),
    ("ZMW", 2), ("ZWG", 2),
];

impl Currency {
    /// The currency of an ISO 4217 code (three capital letters, as written: `rub` is not one),
    /// or the error that says what is accepted.
    pub fn parse(code: &str) -> Result<Currency, String> {
        TABLE
            .iter()
            .find(|(c, _)| *c == code)
            .map(|&(code, minor_units)| Currency { code, minor_units })
            .ok_or_else(|| {
                format!(
                    "{:?} is not an ISO 4217 currency code the platform knows (three capital letters, such as RUB, USD, EUR)",
                    code.chars().take(16).collect::<String>()
                )
            })
    }

    /// `minor` minor units as a plain decimal with a point and no grouping (`123450` RUB is
    /// `1234.50`; CSV and JSON-adjacent text).
    pub fn plain(&self, minor: u64) -> String {
        if self.minor_units == 0 {
            return minor.to_string();
        }
        let scale = 10u64.pow(u32::from(self.minor_units));
        format!("{}.{:0w$}", minor / scale, minor % scale, w = usize::from(self.minor_units))
    }

    /// An amount as an owner types it (`12`, `12.5`, `12,50`), in minor units: digits, then at
    /// most this currency's decimal places after a point or a comma (none for a currency without
    /// a minor unit); no sign, no grouping, at most 12 digits before the point. `None`: not such
    /// an amount. The range is the caller's to check.
    pub fn parse_amount(&self, s: &str) -> Option<u64> {
        let s = s.trim();
        let (int, frac) = match s.split_once(['.', ',']) {
            Some((i, f)) => (i, Some(f)),
            None => (s, None),
        };
        let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        let places = usize::from(self.minor_units);
        let frac = match frac {
            None => "",
            // `12.` is 12, as typed.
            Some(f) if f.len() <= places && digits(f) => f,
            Some(_) => return None,
        };
        if int.is_empty() || int.len() > 12 || !digits(int) {
            return None;
        }
        let scale = 10u64.pow(u32::from(self.minor_units));
        let frac_minor = if frac.is_empty() {
            0
        } else {
            frac.parse::<u64>().ok()? * 10u64.pow((places - frac.len()) as u32)
        };
        int.parse::<u64>().ok()?.checked_mul(scale)?.checked_add(frac_minor)
    }

    /// The whole part and the fraction's digits of `minor` (no fraction for a currency with no
    /// minor unit), each grouped by the caller's rules.
    pub fn split(&self, minor: u64) -> (u64, Option<String>) {
        if self.minor_units == 0 {
            return (minor, None);
        }
        let scale = 10u64.pow(u32::from(self.minor_units));
        (minor / scale, Some(format!("{:0w$}", minor % scale, w = usize::from(self.minor_units))))
    }
}

/// `n` with its thousands grouped by `sep` (`1234567` → `1 234 567`).
pub fn group(n: u64, sep: &str) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 * sep.len());
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push_str(sep);
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_iso_4217_with_their_minor_units() {
        assert_eq!(Currency::parse("RUB"), Ok(Currency { code: "RUB", minor_units: 2 }));
        assert_eq!(Currency::parse("JPY").unwrap().minor_units, 0);
        assert_eq!(Currency::parse("KWD").unwrap().minor_units, 3);
        for bad in ["rub", "RUR", "", "XYZ", "RUBX"] {
            let e = Currency::parse(bad).unwrap_err();
            assert!(e.contains("ISO 4217"), "{bad}: {e}");
        }
        // Sorted, each once, three capital letters.
        for w in TABLE.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?}", w);
        }
        assert!(
            TABLE.iter().all(|(c, m)| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()) && *m <= 3)
        );
        assert_eq!(DEFAULT, Currency::parse("RUB").unwrap());
    }

    #[test]
    fn amounts_are_written_exactly() {
        let rub = Currency::parse("RUB").unwrap();
        assert_eq!(rub.plain(123_450), "1234.50");
        assert_eq!(rub.plain(5), "0.05");
        assert_eq!(Currency::parse("JPY").unwrap().plain(1234), "1234");
        assert_eq!(Currency::parse("KWD").unwrap().plain(1_234_567), "1234.567");
        assert_eq!(rub.split(123_450), (1234, Some("50".into())));
        assert_eq!(group(1_234_567, " "), "1 234 567");
        assert_eq!(group(123, ","), "123");
        assert_eq!(group(1000, ","), "1,000");
        assert_eq!(group(0, ","), "0");
        assert_eq!(group(u64::MAX, ","), "18,446,744,073,709,551,615");
    }

    #[test]
    fn amounts_as_typed_in_each_currencys_places() {
        let rub = Currency::parse("RUB").unwrap();
        for (typed, minor) in
            [("12", 1200), ("12.5", 1250), ("12,50", 1250), (" 0.07 ", 7), ("1000000", 100_000_000)]
        {
            assert_eq!(rub.parse_amount(typed), Some(minor), "{typed}");
        }
        for bad in ["", ".5", "1.234", "-1", "1e3", "12.5.0", "１２", "9999999999999", "1.a", "1 000", "1.-5"]
        {
            assert_eq!(rub.parse_amount(bad), None, "{bad}");
        }
        let jpy = Currency::parse("JPY").unwrap();
        assert_eq!(jpy.parse_amount("1500"), Some(1500));
        assert_eq!(jpy.parse_amount("1500.5"), None, "yen have no minor unit");
        let kwd = Currency::parse("KWD").unwrap();
        assert_eq!(kwd.parse_amount("1.5"), Some(1500));
        assert_eq!(kwd.parse_amount("1,234"), Some(1234));
        assert_eq!(kwd.parse_amount("1.2345"), None);
        // What is written reads back as the same amount, in every currency.
        for c in TABLE.iter().map(|&(code, _)| Currency::parse(code).unwrap()) {
            for minor in [0, 1, 7, 1250, 123_456_789] {
                assert_eq!(c.parse_amount(&c.plain(minor)), Some(minor), "{} {minor}", c.code);
            }
        }
    }
}
