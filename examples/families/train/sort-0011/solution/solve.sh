#!/bin/bash
sort records.txt > total.txt
