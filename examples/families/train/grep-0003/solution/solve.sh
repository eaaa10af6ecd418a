#!/bin/bash
grep fail data.txt > summary.txt
