//! Which servers a provider may reach: the `rag.provider_hosts` allowlist a superuser sets.
//!
//! A `rag_admin` names provider URLs, so without a list the database server connects wherever they say. With
//! one, a URL's host must be listed: by name (exact, or `*.domain` for its subdomains), or by address (an IP
//! address or a CIDR block), either optionally with `:port`. A name listed by name is trusted with whatever its
//! DNS answers, as the superuser who listed it chose; any other name must resolve to listed addresses, and it
//! is checked on the addresses the connection is then made to, so a name that answers differently the second
//! time (DNS rebinding) still reaches only listed addresses.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::Url;

/// A parsed `rag.provider_hosts`. Empty means no list was set: every host is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAllowlist {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// A lowercase host name without a trailing dot.
    Name(String),
    /// `*.suffix`: any name ending in `.suffix` (not `suffix` itself).
    Subdomains(String),
    /// An address is a block of one.
    Block(IpNet),
}

/// How a URL's host passed the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// No list, a listed name, or a listed address literal: connect as usual.
    Open,
    /// A name not listed as such: connect only to the addresses it resolves to that lie in these blocks.
    ToAddresses(Vec<IpNet>),
}

impl HostAllowlist {
    /// Parses entries separated by commas and/or whitespace. Errors name the entry at fault.
    pub fn parse(text: &str) -> Result<HostAllowlist, String> {
        let entries = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|entry| !entry.is_empty())
            .map(|entry| parse_entry(entry).map_err(|why| format!("entry \"{entry}\": {why}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HostAllowlist { entries })
    }

    /// True when no list was set (every host is allowed).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `url` may be reached, and on what terms. The error says why not, without the URL's path.
    pub fn admit(&self, url: &Url) -> Result<Admission, String> {
        if self.entries.is_empty() {
            return Ok(Admission::Open);
        }
        let port = url.port_or_known_default();
        let applies = |entry: &&Entry| entry.port.is_none() || entry.port == port;
        let shown_port = port.map(|port| format!(":{port}")).unwrap_or_default();
        let address = match url.host() {
            Some(url::Host::Ipv4(address)) => Some(IpAddr::V4(address)),
            Some(url::Host::Ipv6(address)) => Some(IpAddr::V6(address)),
            Some(url::Host::Domain(_)) => None,
            None => return Err("the URL has no host".to_string()),
        };
        if let Some(address) = address {
            if self
                .entries
                .iter()
                .filter(applies)
                .any(|entry| match &entry.host {
                    HostPattern::Block(block) => block.contains(&address),
                    _ => false,
                })
            {
                return Ok(Admission::Open);
            }
            return Err(format!(
                "{address}{shown_port} is not in rag.provider_hosts"
            ));
        }
        let name = url
            .host_str()
            .unwrap_or_default()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if self
            .entries
            .iter()
            .filter(applies)
            .any(|entry| match &entry.host {
                HostPattern::Name(listed) => *listed == name,
                HostPattern::Subdomains(suffix) => name
                    .strip_suffix(suffix.as_str())
                    .is_some_and(|head| !head.is_empty()),
                HostPattern::Block(_) => false,
            })
        {
            return Ok(Admission::Open);
        }
        let blocks: Vec<IpNet> = self
            .entries
            .iter()
            .filter(applies)
            .filter_map(|entry| match &entry.host {
                HostPattern::Block(block) => Some(*block),
                _ => None,
            })
            .collect();
        if blocks.is_empty() {
            return Err(format!("{name}{shown_port} is not in rag.provider_hosts"));
        }
        Ok(Admission::ToAddresses(blocks))
    }
}

fn parse_entry(entry: &str) -> Result<Entry, String> {
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or("an opening [ without its ]")?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(
                after
                    .strip_prefix(':')
                    .ok_or("after ] only :port may follow")?,
            )?),
        };
        (inside, port)
    } else if entry.matches(':').count() >= 2 {
        // An IPv6 address or block without brackets cannot carry a port.
        (entry, None)
    } else if let Some((host, port)) = entry.rsplit_once(':') {
        (host, Some(parse_port(port)?))
    } else {
        (entry, None)
    };
    Ok(Entry {
        host: parse_host(host)?,
        port,
    })
}

fn parse_port(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(format!("\"{text}\" is not a port (1-65535)")),
    }
}

fn parse_host(text: &str) -> Result<HostPattern, String> {
    if text.contains('/') {
        let block = text.parse::<IpNet>().map_err(|_| {
            format!("\"{text}\" is not an address block such as 10.0.0.0/8 or fd00::/8")
        })?;
        // 10.1.2.3/8 is almost certainly a typo for a host or for 10.0.0.0/8: say so rather than guess.
        if block.trunc() != block {
            return Err(format!(
                "\"{text}\" has bits set past its prefix length (did you mean {}?)",
                block.trunc()
            ));
        }
        return Ok(HostPattern::Block(block));
    }
    if let Ok(address) = text.parse::<IpAddr>() {
        return Ok(HostPattern::Block(IpNet::from(address)));
    }
    let name = text.trim_end_matches('.').to_ascii_lowercase();
    let (pattern, bare) = match name.strip_prefix("*.") {
        Some(suffix) => (
            HostPattern::Subdomains(format!(".{suffix}")),
            suffix.to_string(),
        ),
        None => (HostPattern::Name(name.clone()), name.clone()),
    };
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
    };
    if bare.is_empty() || bare.len() > 253 || !bare.split('.').all(valid_label) {
        return Err(format!(
            "\"{text}\" is not a host name, *.domain, IP address or address block"
        ));
    }
    Ok(pattern)
}

/// The error a refused connection carries, told apart from network failures (it will not heal by retrying).
#[derive(Debug)]
pub(crate) struct HostRefused(pub String);

impl fmt::Display for HostRefused {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for HostRefused {}

/// Resolves names as the system does, keeping only the addresses inside the admitted blocks.
pub(crate) struct AddressCheckingResolver {
    pub blocks: Arc<Vec<IpNet>>,
}

impl reqwest::dns::Resolve for AddressCheckingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let blocks = self.blocks.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let lookup_host = host.clone();
            let found: Vec<SocketAddr> =
                tokio::task::spawn_blocking(move || (lookup_host.as_str(), 0).to_socket_addrs())
                    .await
                    .map_err(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>)??
                    .collect();
            let kept: Vec<SocketAddr> = found
                .into_iter()
                .filter(|address| blocks.iter().any(|block| block.contains(&address.ip())))
                .collect();
            if kept.is_empty() {
                // The addresses themselves are not named: a rag_admin should not learn the server's view of DNS.
                return Err(Box::new(HostRefused(format!(
                    "{host} resolves to no address in rag.provider_hosts"
                )))
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(list: &str, url: &str) -> Result<Admission, String> {
        HostAllowlist::parse(list)
            .unwrap()
            .admit(&Url::parse(url).unwrap())
    }

    #[test]
    fn an_empty_list_admits_everything() {
        assert_eq!(
            admit("", "http://169.254.169.254/latest"),
            Ok(Admission::Open)
        );
        assert_eq!(admit(" , ", "http://internal:8080"), Ok(Admission::Open));
    }

    #[test]
    fn names_match_exactly_or_as_subdomains() {
        let list = "ollama.internal:11434, *.openai.azure.com";
        assert_eq!(
            admit(list, "http://Ollama.Internal.:11434/api"),
            Ok(Admission::Open)
        );
        assert!(admit(list, "http://ollama.internal:11435")
            .unwrap_err()
            .contains("ollama.internal:11435"));
        assert!(admit(list, "http://ollama.internal").is_err());
        assert_eq!(
            admit(list, "https://team.openai.azure.com/openai"),
            Ok(Admission::Open)
        );
        assert_eq!(
            admit(list, "https://a.b.openai.azure.com"),
            Ok(Admission::Open)
        );
        assert!(admit(list, "https://openai.azure.com").is_err());
        assert!(admit(list, "https://evilopenai.azure.com").is_err());
        assert!(admit(list, "https://openai.azure.com.evil.net").is_err());
    }

    #[test]
    fn address_literals_need_a_block_that_holds_them() {
        let list = "10.0.0.0/8:11434 127.0.0.1 [::1]:8080 fd00::/8";
        assert_eq!(admit(list, "http://10.9.8.7:11434"), Ok(Admission::Open));
        assert!(admit(list, "http://10.9.8.7:22").is_err());
        assert_eq!(admit(list, "http://127.0.0.1:5"), Ok(Admission::Open));
        assert!(admit(list, "http://127.0.0.2").is_err());
        assert_eq!(admit(list, "http://[::1]:8080"), Ok(Admission::Open));
        assert!(admit(list, "http://[::1]:8081").is_err());
        assert_eq!(admit(list, "http://[fd12::5]"), Ok(Admission::Open));
        // 169.254.169.254 written in other ways is still that address to the URL parser.
        assert!(admit(list, "http://2852039166/").is_err());
        assert!(admit(list, "http://0xa9.0xfe.0xa9.0xfe/").is_err());
        assert_eq!(admit(list, "http://0x0a.1.2.3:11434/"), Ok(Admission::Open));
    }

    #[test]
    fn unlisted_names_go_to_their_addresses_when_blocks_are_listed() {
        let list = "10.0.0.0/8:11434, 192.168.1.0/24";
        assert_eq!(
            admit(list, "http://embedder.lan:11434"),
            Ok(Admission::ToAddresses(vec![
                "10.0.0.0/8".parse().unwrap(),
                "192.168.1.0/24".parse().unwrap()
            ]))
        );
        assert_eq!(
            admit(list, "https://embedder.lan"),
            Ok(Admission::ToAddresses(vec!["192.168.1.0/24"
                .parse()
                .unwrap()]))
        );
        assert!(admit("api.openai.com", "http://embedder.lan").is_err());
    }

    #[test]
    fn bad_entries_are_named() {
        for (list, fault) in [
            ("10.1.2.3/8", "did you mean 10.0.0.0/8"),
            ("host:0", "not a port"),
            ("host:99999", "not a port"),
            ("[::1", "without its ]"),
            ("[::1]8080", "only :port"),
            ("exa mple.com:x", "\"mple.com:x\""),
            ("http://host", "entry \"http://host\""),
            ("*.", "not a host name"),
            ("a..b", "not a host name"),
            ("10.0.0.0/33", "not an address block"),
        ] {
            let error = HostAllowlist::parse(list).unwrap_err();
            assert!(error.contains(fault), "{list}: {error}");
        }
    }

    #[test]
    fn resolved_addresses_outside_the_blocks_are_refused() {
        use reqwest::dns::Resolve;
        use std::str::FromStr;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let resolve = |blocks: &str| {
            let resolver = AddressCheckingResolver {
                blocks: Arc::new(vec![blocks.parse().unwrap()]),
            };
            runtime.block_on(resolver.resolve(reqwest::dns::Name::from_str("localhost").unwrap()))
        };
        let kept: Vec<SocketAddr> = resolve("127.0.0.0/8").unwrap().collect();
        assert!(!kept.is_empty() && kept.iter().all(|address| address.ip().is_loopback()));
        let refused = resolve("10.0.0.0/8").err().unwrap();
        assert_eq!(
            refused.to_string(),
            "localhost resolves to no address in rag.provider_hosts"
        );
        assert!(refused.downcast_ref::<HostRefused>().is_some());
    }
}
