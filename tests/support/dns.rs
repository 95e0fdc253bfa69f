//! A real DNS server on 127.0.0.1 (hickory-server) for the discovery tests:
//! zone `test.`, answers that a test replaces while it runs (TTL 0).
#![allow(dead_code, clippy::unwrap_used)]

use hickory_server::authority::{AuthorityObject, Catalog, ZoneType};
use hickory_server::proto::rr::rdata::{A, SOA, SRV};
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RecordType};
use hickory_server::store::in_memory::InMemoryAuthority;
use hickory_server::ServerFuture;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

pub(crate) struct TestDns {
    pub addr: SocketAddr,
    zone: Arc<InMemoryAuthority>,
    serial: AtomicU32,
    _server: ServerFuture<Catalog>,
}

impl TestDns {
    /// Serves zone `test.` on a UDP port of 127.0.0.1.
    pub(crate) async fn start() -> Self {
        let origin = Name::from_str("test.").unwrap();
        let mut zone = InMemoryAuthority::empty(origin.clone(), ZoneType::Primary, false);
        let soa = SOA::new(
            Name::from_str("ns.test.").unwrap(),
            Name::from_str("admin.test.").unwrap(),
            1,
            60,
            60,
            60,
            0,
        );
        zone.upsert_mut(Record::from_rdata(origin.clone(), 0, RData::SOA(soa)), 1);
        let zone = Arc::new(zone);
        let mut catalog = Catalog::new();
        catalog.upsert(
            LowerName::new(&origin),
            vec![Arc::clone(&zone) as Arc<dyn AuthorityObject>],
        );
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let mut server = ServerFuture::new(catalog);
        server.register_socket(socket);
        TestDns {
            addr,
            zone,
            serial: AtomicU32::new(2),
            _server: server,
        }
    }

    async fn replace(&self, name: &str, kind: RecordType, records: Vec<Record>) {
        let owner = LowerName::new(&Name::from_str(name).unwrap());
        self.zone
            .records_mut()
            .await
            .retain(|k, _| !(k.name == owner && k.record_type == kind));
        for r in records {
            let serial = self.serial.fetch_add(1, Ordering::Relaxed);
            self.zone.upsert(r, serial).await;
        }
    }

    /// `name` (e.g. `engines.test.`) answers these A records from now on.
    pub(crate) async fn set_a(&self, name: &str, ips: &[Ipv4Addr]) {
        let n = Name::from_str(name).unwrap();
        let records = ips
            .iter()
            .map(|ip| Record::from_rdata(n.clone(), 0, RData::A(A(*ip))))
            .collect();
        self.replace(name, RecordType::A, records).await;
    }

    /// `name` answers these SRV records (target, port) from now on.
    pub(crate) async fn set_srv(&self, name: &str, targets: &[(&str, u16)]) {
        let n = Name::from_str(name).unwrap();
        let records = targets
            .iter()
            .map(|(t, port)| {
                let srv = SRV::new(0, 0, *port, Name::from_str(t).unwrap());
                Record::from_rdata(n.clone(), 0, RData::SRV(srv))
            })
            .collect();
        self.replace(name, RecordType::SRV, records).await;
    }
}
