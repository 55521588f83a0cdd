//! Distributions of prompt and output lengths: `128` (fixed), `uniform:16-512`,
//! `normal:200,50` (clamped at 1), `choice:16,64,256`.

use rand::Rng;
use rand_distr::{Distribution, Normal};

#[derive(Debug, Clone, PartialEq)]
pub enum Dist {
    Fixed(u32),
    Uniform(u32, u32),
    Normal(f64, f64),
    Choice(Vec<u32>),
}

impl std::str::FromStr for Dist {
    type Err = String;

    fn from_str(s: &str) -> Result<Dist, String> {
        let bad = || {
            format!("'{s}' is not a length distribution (N, uniform:A-B, normal:MEAN,SD or choice:A,B,...)")
        };
        let num = |x: &str| x.trim().parse::<u32>().map_err(|_| bad());
        let d = match s.split_once(':') {
            None => Dist::Fixed(num(s)?),
            Some(("uniform", r)) => {
                let (a, b) = r.split_once('-').ok_or_else(bad)?;
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(bad());
                }
                Dist::Uniform(a, b)
            }
            Some(("normal", r)) => {
                let (m, sd) = r.split_once(',').ok_or_else(bad)?;
                let (m, sd): (f64, f64) = (
                    m.trim().parse().map_err(|_| bad())?,
                    sd.trim().parse().map_err(|_| bad())?,
                );
                if !(m.is_finite() && sd.is_finite() && sd >= 0.0) {
                    return Err(bad());
                }
                Dist::Normal(m, sd)
            }
            Some(("choice", r)) => Dist::Choice(r.split(',').map(num).collect::<Result<_, _>>()?),
            _ => return Err(bad()),
        };
        if d.max() == 0 {
            return Err(format!("'{s}' must allow lengths of at least 1"));
        }
        Ok(d)
    }
}

impl Dist {
    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        match self {
            Dist::Fixed(n) => *n,
            Dist::Uniform(a, b) => rng.gen_range(*a..=*b),
            Dist::Normal(m, sd) => Normal::new(*m, *sd)
                .map(|d| d.sample(rng).round().max(1.0) as u32)
                .unwrap_or(*m as u32),
            Dist::Choice(v) => v[rng.gen_range(0..v.len())],
        }
        .max(1)
    }

    /// The largest value it can give (normal: mean + 4 sd).
    pub fn max(&self) -> u32 {
        match self {
            Dist::Fixed(n) => *n,
            Dist::Uniform(_, b) => *b,
            Dist::Normal(m, sd) => (m + 4.0 * sd).max(1.0) as u32,
            Dist::Choice(v) => v.iter().copied().max().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_samples_within_bounds() {
        let mut rng = rand::thread_rng();
        let u: Dist = "uniform:16-32".parse().unwrap();
        assert!((0..1000)
            .map(|_| u.sample(&mut rng))
            .all(|x| (16..=32).contains(&x)));
        assert_eq!("64".parse::<Dist>().unwrap(), Dist::Fixed(64));
        let c: Dist = "choice:1,5".parse().unwrap();
        assert!((0..100)
            .map(|_| c.sample(&mut rng))
            .all(|x| x == 1 || x == 5));
        assert!("normal:10,3".parse::<Dist>().is_ok());
        for bad in ["", "uniform:9-3", "gauss:1", "choice:", "0", "normal:1,-1"] {
            assert!(bad.parse::<Dist>().is_err(), "{bad}");
        }
    }
}
